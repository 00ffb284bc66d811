"""Past trajectories -> ordered Add messages -> Add requests (one session per trajectory).

Rules (sources: AML user documentation, "Coding preserves repository/session trajectories" and the
Textual chunking rule "20 messages or 2,000 Adapter-counted words"; DESIGN.md "IDs"):

- One trajectory is one session; its session key is the trajectory id. Turns keep their order,
  roles (user, assistant, tool) and timestamps; empty turns are dropped (content must be non-empty).
- The first message of a session is prefixed with a header line ``[trajectory <id> on <repo>]`` so a
  retrieved chunk says where it came from.
- Each session is chunked by :func:`aml_ray.datasets.chunking.split_messages` (the Textual rule); chunk
  indices run 0-based across the sample (task x condition), in memory-set order.
- ``user_id = eval:<run>:<dataset>:<instance_id>.<condition>``: one isolation boundary per task and
  condition, so relevant and noisy memories never meet.
"""

from __future__ import annotations

from aml_ray.coding.task import Condition, Trajectory
from aml_ray.contract import AddRequest, Message, SearchRequest
from aml_ray.datasets.base import Sample, Session
from aml_ray.datasets.chunking import chunk_sample, count_words
from aml_ray.ids import IdScheme


def sample_id(instance_id: str, condition: Condition) -> str:
    """The sample (one user_id) of a task under a condition: ``<instance_id>.<condition>``."""
    return f"{instance_id}.{condition}"


def trajectory_messages(trajectory: Trajectory) -> tuple[Message, ...]:
    """A trajectory's turns as contract messages (see the module rules).

    Args:
        trajectory: the past session.

    Returns:
        The messages in order; empty when the trajectory has no non-empty turn.
    """
    messages: list[Message] = []
    for turn in trajectory.turns:
        text = turn.content.strip()
        if not text:
            continue
        if not messages:
            text = f"[trajectory {trajectory.trajectory_id} on {trajectory.repo}]\n{text}"
        messages.append(Message(role=turn.role, content=text, timestamp=turn.timestamp_ms))
    return tuple(messages)


def trajectory_sample(sid: str, trajectories: list[Trajectory]) -> Sample:
    """A sample whose sessions are the trajectories, in the given order (no questions)."""
    sessions = []
    for i, traj in enumerate(trajectories, start=1):
        msgs = trajectory_messages(traj)
        started = next((m.timestamp for m in msgs if m.timestamp is not None), 0)
        sessions.append(Session(key=traj.trajectory_id, index=i, started_at_ms=started, messages=msgs))
    return Sample(sample_id=sid, sessions=tuple(sessions), questions=())


def add_requests(ids: IdScheme, sid: str, trajectories: list[Trajectory]) -> tuple[list[AddRequest],
                                                                                   list[dict[str, int]]]:
    """The ordered Add requests of one sample and their per-chunk metadata.

    Args:
        ids: the run's id scheme.
        sid: the sample id (:func:`sample_id`).
        trajectories: the memory set, in order.

    Returns:
        ``(requests, meta)``: AddRequests in order, and ``{"chunk_index", "n_words"}`` per request.
    """
    requests, meta = [], []
    for chunk in chunk_sample(trajectory_sample(sid, trajectories)):
        requests.append(AddRequest(request_id=ids.request_id(sid, chunk.index), messages=list(chunk.messages),
                                   user_id=ids.user_id(sid), session_id=ids.session_id(sid, chunk.session_key)))
        meta.append({"chunk_index": chunk.index, "n_words": sum(count_words(m) for m in chunk.messages)})
    return requests, meta


def search_request(ids: IdScheme, sid: str, problem_statement: str, top_k: int) -> SearchRequest:
    """The task's Search: the problem statement, unchanged, as the query (no options)."""
    return SearchRequest(query=problem_statement, user_id=ids.user_id(sid), top_k=top_k)
