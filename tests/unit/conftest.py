import pytest

from gateway.tokenizer.bundled import default_tokenizer_dir


@pytest.fixture(scope="session")
def qwen_dir():
    return default_tokenizer_dir()
