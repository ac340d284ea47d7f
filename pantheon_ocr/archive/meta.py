"""What an archive job's state knows of the job as a whole, in its `meta` table: the reading
settings of the last run and the marks a new state carries.
A mixin of `state.JobState` (self.db is its connection), kept apart so each file stays readable.
"""

from __future__ import annotations

import json

from ..errors import JobError, path_text
from .sqlite import Txn


class MetaMixin:
    db: object  # sqlite3.Connection, set by JobState
    path: object  # the state file, set by JobState

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str | None) -> None:
        with Txn(self.db) as db:
            if value is None:
                db.execute("DELETE FROM meta WHERE key=?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

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
        """This state is job `name`'s: the first run of a state (or of one made by a version that
        did not keep the name) writes it (unless not `write`: status and reports read only); a
        job of another name is refused (JobError). Two job files naming one `state =` (a job
        file copied, its `state` left) mixed their documents, runs and reports in it, and each
        run counted the other's documents as gone."""
        owner = self._meta("job")
        if owner is None:
            if not write:
                return
            self._set_meta("job", name)
            self._set_meta("job_file", str(job_file))
        elif owner != name:
            other = self._meta("job_file")
            raise JobError(f"{path_text(self.path)}: this is the state of job {owner!r}"
                           + (f" ({path_text(other)})" if other else "") + f", not of job {name!r} "
                           f"({path_text(job_file)}): two jobs sharing a state mix their documents, runs and reports; "
                           f"give this job a `state =` of its own, or, if it is job {owner!r} renamed, "
                           f"set name = {json.dumps(owner)} in {path_text(job_file)}")
