"""Regenerate the Python code for the .proto files in this directory: ``python -m proto.generate``.

The generated ``*_pb2.py`` files are committed, so installing smg-node needs no
compiler; ``tests/unit/test_proto_generated.py`` regenerates them into a temporary
directory and fails when the committed ones differ. Needs ``grpcio-tools`` (a test
dependency, pinned in pyproject.toml so every machine produces the same bytes).
"""

from __future__ import annotations

import pathlib
import sys

PROTO_DIR = pathlib.Path(__file__).resolve().parent
PROTO_FILES = ("ratelimit.proto",)


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Compile every proto file into ``out_dir``; returns the files written."""
    from grpc_tools import protoc  # imported here: only needed to regenerate

    for name in PROTO_FILES:
        code = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}",
                            str(PROTO_DIR / name)])
        if code != 0:
            raise RuntimeError(f"protoc failed on {name} (exit {code})")
    return [out_dir / name.replace(".proto", "_pb2.py") for name in PROTO_FILES]


if __name__ == "__main__":
    for path in generate(PROTO_DIR):
        print(f"wrote {path.relative_to(PROTO_DIR.parent)}")
    sys.exit(0)
