"""Scoring: LoCoMo F1, BLEU-1, the offline lexical judge, judge-reply parsing and aggregation.

Pure Python (no Ray, no HTTP). One module per scoring concept; each names its source.

The score table (:mod:`aml_ray.scoring.aggregate`: ``aggregate``, ``latency_summary``, ``OVERALL``) is
imported from its module, not from this package: it needs polars, which ``aml-ray run``'s checks before the
pre-flight (the suite bundles' judge protocols, :mod:`aml_ray.scoring.judge_protocols`) then do not
import.
"""

from aml_ray.scoring.bleu import bleu1
from aml_ray.scoring.f1 import locomo_f1, multi_answer_f1, token_f1
from aml_ray.scoring.judge_parse import LABELS, JudgeParseError, parse_judge_label
from aml_ray.scoring.lexical_judge import OFFLINE_JUDGE_NAME, lexical_verdict
from aml_ray.scoring.normalize import normalize_answer, stemmed_tokens

__all__ = [
    "LABELS",
    "OFFLINE_JUDGE_NAME",
    "JudgeParseError",
    "bleu1",
    "lexical_verdict",
    "locomo_f1",
    "multi_answer_f1",
    "normalize_answer",
    "parse_judge_label",
    "stemmed_tokens",
    "token_f1",
]
