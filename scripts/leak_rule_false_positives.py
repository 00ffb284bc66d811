"""How often the run's leak rule (aml_ray.run.isolation) would call an honest participant's memory a leak.

For every benchmark file given (or every one present under the datasets directory), it builds the Adds a run
sends (the real adapters, chunker and ids), then asks the leak rule about every memory an honest store could
return for each user_id: each message it was sent (a store of messages, like the reference system) and each
chunk it was sent, whole (a store of chunks). Every hit is a false positive: nothing here is another user's.
It also plants one real leak per dataset (another user's longest message, returned to the first user) to show
the rule still catches it.

    python scripts/leak_rule_false_positives.py                       # every present file of ../shared/datasets
    python scripts/leak_rule_false_positives.py longmemeval_s=PATH ...  # dataset=path pairs

Prints one line per dataset: users, memories checked, false positives, and whether the planted leak was found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from aml_ray.datasets.registry import get_dataset
from aml_ray.ids import IdScheme
from aml_ray.run.inputs import sample_input
from aml_ray.run.isolation import LeakFinder, index_adds

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
DEFAULT = {"locomo": SHARED / "locomo" / "locomo10.json",
           "longmemeval_oracle": SHARED / "longmemeval" / "longmemeval_oracle_reassembled.json",
           "beam": SHARED / "beam" / "100K"}


def texts(add: dict) -> list[str]:
    return [m["content"] if isinstance(m["content"], str) else " ".join(
        p.get("text", "") for p in m["content"] if p.get("type") == "text") for m in add["messages"]]


def measure(dataset: str, path: Path) -> dict:
    """``{users, memories, false_positives, examples, planted_found, seconds}`` for one dataset file."""
    t0 = time.perf_counter()
    samples = get_dataset(dataset).read(path)
    ids = IdScheme("fp", dataset)
    adds = {}
    for sample in samples:
        adds[ids.user_id(sample.sample_id)] = json.loads(sample_input(sample, ids).row["adds_json"])
    finder = LeakFinder(index_adds(adds.items()), limit=10**9)
    memories = 0
    for user, user_adds in adds.items():
        rows = []
        for add in user_adds:
            parts = texts(add)
            rows.append({"id": add["request_id"], "content": "\n".join(parts)})  # the whole chunk
            rows += [{"id": f"{add['request_id']}#{i}", "content": t} for i, t in enumerate(parts)]
        memories += len(rows)
        for i, row in enumerate(rows):
            finder.check({"question_id": f"{user}#{i}", "user_id": user, "memories": [row]})
    false_positives = list(finder.leaks)
    users = list(adds)
    planted_found = None
    if len(users) > 1:  # another user's longest message, returned to the first user
        other = max((t for add in adds[users[1]] for t in texts(add)), key=len)
        finder.check({"question_id": "planted", "user_id": users[0], "memories": [{"id": "x", "content": other}]})
        planted_found = any(leak["question_id"] == "planted" for leak in finder.leaks)
    return {"users": len(users), "memories": memories, "false_positives": len(false_positives),
            "examples": false_positives[:3], "planted_found": planted_found,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="dataset=path pairs (default: the present files of ../shared)")
    args = parser.parse_args(argv)
    pairs = [f.split("=", 1) for f in args.files] or [(d, p) for d, p in DEFAULT.items() if Path(p).exists()]
    bad = 0
    for dataset, path in pairs:
        r = measure(dataset, Path(path))
        bad += r["false_positives"] + (r["planted_found"] is False)
        print(f"{dataset:12s} users {r['users']:4d}  memories {r['memories']:7d}  false positives "
              f"{r['false_positives']}  planted leak found {r['planted_found']}  ({r['seconds']} s)")
        for leak in r["examples"]:
            print(f"    e.g. {leak['question_id']} ~ {leak['owner_user_id']}: {leak['evidence']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
