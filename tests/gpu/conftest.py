"""The GPU tier (make test-gpu): every test in this folder needs a CUDA GPU and is skipped, with the reason,
where torch sees none."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the hook sees the whole session's items: only this folder's are ours
    ours = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not ours:
        return
    import torch  # here, not at import: collecting the rest of the suite does not pay for it

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"no CUDA GPU here: torch.cuda.is_available() is False (torch {torch.__version__})")
    for item in ours:
        item.add_marker(skip)
