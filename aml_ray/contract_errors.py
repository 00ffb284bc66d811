"""The contract's error, in a module of its own so that every checker can raise it.

:mod:`aml_ray.contract` (the Add/Search models) and :mod:`aml_ray.media` (content parts, which the
models check) both raise :class:`ContractError`; defining it here keeps ``media`` from importing
``contract`` back (the contract <-> media import circle). Import it from either place.
"""

from __future__ import annotations

from typing import Any


class ContractError(Exception):
    """A participant response broke the AML contract.

    Args:
        field: dotted path of the offending field, e.g. ``"request_id"`` or ``"data[3].content"``.
        reason: what is wrong and how to fix it, in one sentence.
        request_id: the platform request the response belongs to (no secrets), when known: an Add's
            request_id, or a Search's question ref.
        outcome: the request's outcome for its evidence row, set by
            :class:`~aml_ray.actors.participant.ParticipantClient` (``request_id``, ``request_sha256``,
            ``status="contract_error"``, ``http_status``, ``attempts``, ``retried_statuses``, ``latency_ms``,
            ``elapsed_ms``, ``contract`` = ``"<field>: <reason>"``, ``error``; the secret redacted); None
            when the error was raised outside the client.

    Contract errors are never retried (seed: "Contract errors stop immediately").
    """

    def __init__(self, field: str, reason: str, request_id: str | None = None,
                 outcome: dict[str, Any] | None = None):
        self.field = field
        self.reason = reason
        self.request_id = request_id
        self.outcome = outcome
        where = f" (request {request_id})" if request_id else ""
        super().__init__(f"contract violation in field '{field}'{where}: {reason}")

    def __reduce__(self):  # keeps field/reason/outcome when the error crosses a Ray process boundary
        return (ContractError, (self.field, self.reason, self.request_id, self.outcome))
