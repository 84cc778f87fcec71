"""A node's config from the flags ``smg-node serve`` takes, as the CLI builds it."""

from __future__ import annotations

import argparse

from gateway.node.config import add_serve_arguments, build_config


def parse(argv, environ=None):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return build_config(parser.parse_args(argv), environ or {})
