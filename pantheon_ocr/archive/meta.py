"""What an archive job's state knows of the job as a whole, in its `meta` table: the reading
settings of the last run and the marks a new state carries.
A mixin of `state.JobState` (self.db is its connection), kept apart so each file stays readable.
"""

from __future__ import annotations

import contextlib
import json
import os

from ..errors import JobError, path_text
from .sqlite import Txn


class MetaMixin:
    db: object  # sqlite3.Connection, set by JobState
    path: object  # the state file, set by JobState

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str | None) -> None:
        with Txn(self.db):
            self._put_meta(key, value)

    def _put_meta(self, key: str, value: str | None) -> None:
        """_set_meta inside the caller's transaction."""
        if value is None:
            self.db.execute("DELETE FROM meta WHERE key=?", (key,))
        else:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def reading(self) -> dict | None:
        """The reading settings of the last run (reading.py), None before the first."""
        value = self._meta("reading")
        try:
            return json.loads(value) if value is not None else None
        except ValueError:
            return None

    def set_reading(self, reading: dict) -> None:
        self._set_meta("reading", json.dumps(reading, sort_keys=True))

    def must_recover(self) -> bool:
        """True until a run has taken back the pages the outputs on disk already hold (a new
        state's first run; a run killed before it was done leaves it for the next)."""
        return self._meta("recover_outputs") == "1"

    def recovered(self) -> None:
        self._set_meta("recover_outputs", None)

    def claim(self, name: str, job_file, write: bool = True) -> None:
        """This state is job `name`'s, of `job_file`: the first run of a state (or of one made by a
        version that did not keep the name) writes both, in one transaction; a later run of the
        job from a file moved or renamed (the one recorded is gone) writes the new file. Refused
        (JobError): a job of another name, and a second job file of the same name while the one
        recorded is still there (a job file copied, its `state` left): two jobs mixed their
        documents, runs and reports in one state, and each run counted the other's documents as
        gone. `write` False (status, reports): read only."""
        job_file = str(job_file)
        with Txn(self.db) if write else contextlib.nullcontext():
            owner, recorded = self._meta("job"), self._meta("job_file")
            if owner is not None and (owner != name or _another_file(recorded, job_file)):
                raise JobError(_foreign(self.path, owner, recorded, name, job_file))
            if write and (owner, recorded) != (name, job_file):
                self._put_meta("job", name)
                self._put_meta("job_file", job_file)


def _another_file(recorded: str | None, job_file: str) -> bool:
    """The recorded job file is still there and is not `job_file` (a copy, not a move)."""
    if not recorded or recorded == job_file or not os.path.exists(recorded):
        return False
    try:
        return not os.path.samefile(recorded, job_file)
    except OSError:
        return True


def _foreign(state, owner: str, recorded: str | None, name: str, job_file: str) -> str:
    where = f" ({path_text(recorded)}{'' if recorded and os.path.exists(recorded) else ', no longer there'})" \
        if recorded else ""
    if owner != name:
        return (f"{path_text(state)}: this is the state of job {owner!r}{where}, not of job {name!r} "
                f"({path_text(job_file)}): two jobs sharing a state mix their documents, runs and reports; give this "
                f"job a `state =` of its own, or, if it is job {owner!r} renamed, set name = {json.dumps(owner)} in "
                f"{path_text(job_file)}")
    return (f"{path_text(state)}: this is the state of job {owner!r} of {path_text(recorded)}, which is still there, "
            f"and {path_text(job_file)} names it too: two job files sharing a state mix their documents, runs and "
            f"reports; give this one a `state =` of its own (or remove the other if this one replaces it)")
