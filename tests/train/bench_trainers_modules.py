"""scripts/bench_trainers.py and its modules, loaded as running the script loads them, for the bench's tests
(test_bench_trainers.py, test_bench_trainers_peers.py)."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))  # as running the script puts its folder first: its report module beside it
spec = importlib.util.spec_from_file_location("bench_trainers", SCRIPTS / "bench_trainers.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
report = sys.modules["bench_trainers_report"]
modelopt = sys.modules["bench_trainers_modelopt"]
jobs = sys.modules["bench_trainers_jobs"]
medusa = sys.modules["bench_trainers_medusa"]
eagle = sys.modules["bench_trainers_eagle"]
