"""Fault drill: LoCoMo against the chaos participant; nothing lost, nothing counted twice.

Runs the whole pipeline (Ray, reference system wrapped by aml_ray.reference.chaos) at a total fault
rate (default 20%: 429 with Retry-After, 500, 503, slow replies past the timeout, dropped connections,
writes that commit and then time out) and prints: questions scored vs expected, duplicate messages
stored by the participant, Adds re-sent and acknowledged without storing, retries by status code and
the wall time.

    python scripts/drill_faults.py --data ../shared/datasets/locomo/locomo10.json [--rate 0.2] [--limit-samples N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.reference.server import ReferenceServer
from aml_ray.retry import RetryPolicy


def fault_spec(rate: float, seed: int, timeout_s: float) -> str:
    """Split ``rate`` over the transient fault kinds (malformed bodies stop a run by contract: not here)."""
    share = {"429": 0.25, "500": 0.1, "503": 0.2, "drop": 0.15, "slow": 0.1, "commit_timeout": 0.2}
    parts = [f"{k}={rate * w:.4f}" for k, w in share.items()]
    return ",".join(parts + [f"seed={seed}", f"slow_s={timeout_s * 1.5}", "retry_after_s=0.5"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--rate", type=float, default=0.2, help="total fault rate per request (default 0.2)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--limit-samples", type=int, default=None)
    ap.add_argument("--timeout-s", type=float, default=2.0, help="per-attempt timeout of the platform")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aml-drill-"))
    spec = fault_spec(args.rate, args.seed, args.timeout_s)
    t0 = time.perf_counter()
    with ReferenceServer(work / "chaos", faults=spec) as srv:
        participant = ParticipantSpec(add_url=srv.add_url, search_url=srv.search_url, timeout_s=args.timeout_s,
                                      retry=RetryPolicy(max_attempts=12, backoff_base_s=0.1, backoff_max_s=2.0))
        result = evaluate(EvaluationConfig(
            dataset="locomo", participant=participant, answer=model_endpoint_from_env("answer", {}),
            judge=model_endpoint_from_env("judge", {}), out_dir=work / "run", data_path=args.data,
            limit_samples=args.limit_samples, run_label="fault-drill"))
        stats = srv.stats()
    wall = time.perf_counter() - t0
    info = result.run_info
    overall = result.table.filter(result.table["category"] == "overall").to_dicts()[0]
    print(f"fault spec                 : {spec}")
    print(f"faults injected            : {json.dumps(stats['faults_injected'], sort_keys=True)}")
    print(f"questions scored / expected: {overall['n_scored']} / {info['dataset']['scorable_questions']}")
    print(f"Adds ok / chunks           : {info['adds']['ok']} / {info['dataset']['chunks']}")
    print(f"messages stored / sent     : {stats['memories']} / {info['dataset']['messages']}")
    print(f"duplicate messages stored  : {stats['duplicate_messages']}")
    print(f"Adds re-sent, acknowledged without storing: {stats['duplicate_adds_acknowledged']}")
    print(f"Add retries by status      : {json.dumps(info['adds']['retries_by_status'], sort_keys=True)}")
    print(f"Search retries by status   : {json.dumps(info['search']['retries_by_status'], sort_keys=True)}")
    print(f"wall time                  : {wall:.1f} s (run dir {work / 'run'})")


if __name__ == "__main__":
    main()
