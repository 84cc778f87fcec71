"""o200k_base's vocabulary for gpt-oss's harmony encoding, made available to tests offline.

``openai-harmony`` downloads ``o200k_base.tiktoken`` from OpenAI, or reads it from the directory
``TIKTOKEN_ENCODINGS_BASE`` names. Machines here reach PyPI and npm, not OpenAI: the same ranks ship
in the ``js-tiktoken`` npm package (MIT), compressed as lines of "<tag> <first rank> <base64 token>...".
This rebuilds the tiktoken file from them and checks it against the published file's sha256, so the
tests run on the real vocabulary or not at all (a skip that says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import urllib.request
from pathlib import Path

import pytest

JS_TIKTOKEN_URL = "https://registry.npmjs.org/js-tiktoken/-/js-tiktoken-1.0.21.tgz"
RANKS_MEMBER = "package/dist/ranks/o200k_base.js"
# sha256 of OpenAI's o200k_base.tiktoken (the hash openai-harmony and tiktoken check it against)
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
FILE_NAME = "o200k_base.tiktoken"


def _valid(path: Path) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == O200K_SHA256


def tiktoken_file_from_js_ranks(js: str) -> bytes:
    """The .tiktoken file ("<base64 token> <rank>" per line, by rank) from js-tiktoken's ranks module."""
    ranks = json.loads(js.strip().removeprefix("export default").strip().removesuffix(";"))["bpe_ranks"]
    entries = []
    for line in ranks.split("\n"):
        if not line:
            continue
        _, first, *tokens = line.split(" ")
        entries += [(int(first) + i, token) for i, token in enumerate(tokens)]
    entries.sort()
    return "".join(f"{token} {rank}\n" for rank, token in entries).encode()


def o200k_vocab_dir(cache_root: Path | None = None) -> Path:
    """A directory holding a verified o200k_base.tiktoken (skips the test when none can be had)."""
    given = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if given and _valid(Path(given) / FILE_NAME):
        return Path(given)
    directory = (cache_root or Path.home() / ".cache" / "smg-node-tests") / "tiktoken"
    path = directory / FILE_NAME
    if _valid(path):
        return directory
    try:
        with urllib.request.urlopen(JS_TIKTOKEN_URL, timeout=60) as response:
            archive = response.read()
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            js = tar.extractfile(RANKS_MEMBER).read().decode()
    except (OSError, KeyError, tarfile.TarError) as e:
        pytest.skip(f"o200k_base vocabulary unavailable (npm's js-tiktoken could not be fetched: {e})")
    data = tiktoken_file_from_js_ranks(js)
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        pytest.fail("the vocabulary rebuilt from js-tiktoken is not OpenAI's o200k_base (sha256 differs)")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return directory


@contextlib.contextmanager
def harmony_vocabulary():
    """gpt-oss's parsers load the vocabulary from here while the block runs (TIKTOKEN_ENCODINGS_BASE set, the
    encoding's cache cleared before and after)."""
    from gateway.parsers import harmony_encoding
    saved = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_vocab_dir())
    harmony_encoding.cache_clear()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = saved
        harmony_encoding.cache_clear()
