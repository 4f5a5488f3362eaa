"""The relay of the runs' hand-offs (cluster mode): the outbox rows (`models.Handoff`), written in the transaction
that queued the runs, are sent to Celery and deleted once the broker took each message.

So a submission never depends on the broker: ``POST /v1/experiments`` commits the experiment, its runs and their
hand-offs in one transaction and answers 202 whether Redis is up or not; a client retry with the same
Idempotency-Key finds that experiment. The API process relays at once (`OutboxRelay.wake`) and then every second
while rows wait, so a run starts as soon as the broker is back; every worker's reaper relays too, for an API process
that died first. Delivery is at least once (a relay that dies between the send and the delete sends again): harmless,
since claims are atomic and every commit is fenced on the lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from shared.db import database_outage, outage_text

log = logging.getLogger(__name__)

BATCH = 200  # hand-offs sent in one transaction


@dataclass(frozen=True)
class Relayed:
    sent: list[str]  # run ids handed to the broker
    waiting: int  # hand-offs left in this batch (the broker failed)
    error: BaseException | None  # why the batch stopped (the broker away), or None
    more: bool = False  # the batch was full and went through: more hand-offs may wait


def relay_once(*, sessions: sessionmaker[Session], send: Callable[[str], None], limit: int = BATCH) -> Relayed:
    """Send the oldest hand-offs in order, stopping at the first send that fails (the broker away: the rest wait
    for the next pass). The sent ones are deleted and their runs marked enqueued in the transaction that held them
    locked; a hand-off whose run no longer waits (cancelled, already claimed) is deleted unsent."""
    sent: list[str] = []
    error: BaseException | None = None
    with sessions.begin() as s:
        rows = repo.take_handoffs(session=s, limit=limit)
        done: list[int] = []
        for h in rows:
            if h.queued:
                try:
                    send(h.run_id)
                except Exception as exc:
                    error = exc
                    break
                sent.append(h.run_id)
            done.append(h.id)
        repo.drop_handoffs(session=s, ids=done)
        repo.mark_enqueued_in(session=s, run_ids=sent)
    return Relayed(sent, len(rows) - len(done), error, more=error is None and len(rows) == limit)


class OutboxRelay:
    """A daemon thread that relays the outbox (`relay_once`) when woken (a submission committed) and every
    ``interval_s`` while hand-offs wait; the broker or the database away is logged once per outage."""

    def __init__(self, sessions: sessionmaker[Session], send: Callable[[str], None], *, interval_s: float = 1.0,
                 name: str = "tasmoe-outbox") -> None:
        self.sessions = sessions
        self.send = send
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._away: str | None = None  # what is away, while it is
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.pass_once()

    def pass_once(self) -> Relayed | None:
        """One relay pass; None when the database could not be read."""
        try:
            out = relay_once(sessions=self.sessions, send=self.send)
        except Exception as exc:
            self._note("database", outage_text(exc) if database_outage(exc) else repr(exc), exc)
            return None
        if out.sent:
            log.info("outbox: handed %d run(s) to the queue: %s", len(out.sent), ", ".join(out.sent))
        if out.error is not None:
            self._note("broker", f"{type(out.error).__name__}: {out.error}", None)
        elif self._away is not None:
            log.info("outbox: the %s answers again", self._away)
            self._away = None
        if out.more:
            self._wake.set()  # the next batch at once
        return out

    def _note(self, what: str, text: str, exc: BaseException | None) -> None:
        if self._away != what:
            if exc is not None and not database_outage(exc):
                log.error("outbox relay pass failed", exc_info=exc)
            else:
                log.warning("outbox: the %s is unreachable (%s); the hand-offs wait in the run database", what, text)
        self._away = what

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10.0)
