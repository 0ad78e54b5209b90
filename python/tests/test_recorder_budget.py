"""The recorder's Python baselines (recorder/spin_record/selectors.py) restate the library's
budget rule, spin_dsa.budget_blocks, because the recorder's virtualenv has no C++ build; they must
score exactly the blocks the C++ predictors beside them in its quality report do."""
import importlib.util
import itertools
import pathlib

import spin_dsa

SELECTORS = pathlib.Path(__file__).resolve().parents[2] / "recorder" / "spin_record" / "selectors.py"


def recorder_budget():
    spec = importlib.util.spec_from_file_location("spin_record_selectors", SELECTORS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # numpy and math only: no recorder environment needed
    return module.budget_blocks


def test_recorder_budget_is_the_library_rule():
    budget = recorder_budget()
    n_blocks = list(range(0, 41)) + [127, 128, 1000, 2 ** 20, 2 ** 31]
    configs = itertools.product([0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99], [1, 64, 256, 2048], [16, 64, 128],
                                [0, 1, 2], [0, 1, 2, 3])
    for sparsity, topk, block, sink, local in configs:
        cfg = dict(target_sparsity=sparsity, topk=topk, page_size=block, sink_blocks=sink, local_blocks=local)
        for n in n_blocks:
            assert budget(sparsity, n, topk, block, sink, local) == spin_dsa.budget_blocks(cfg, n), (cfg, n)
