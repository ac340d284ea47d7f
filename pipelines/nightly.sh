#!/usr/bin/env bash
# Nightly archive run for cron or a systemd timer: one job file, a dated log, the exit code
# passed on (0 ok, 1 some pages or input paths failed, 2 bad job file or damaged job state,
# 3 bad model, 4 no input readable, 69 the Ray cluster unreachable or gone (--ray), 70 an internal
# error (a bug), 71 out of memory or open files, 73 an output or the job state cannot be written
# (disk full, read-only, permissions), 75 still running from the night before, 130 stopped,
# 141 its output's reader gone: not with a log file). A run that finds its job still running
# is refused and says so; the state resumes whatever a killed run left. A damaged state says
# what to do: restore it, or run once with --rebuild-state.
#
#   crontab:  15 2 * * *  /opt/pantheon-ocr/pipelines/nightly.sh /data/jobs/scans.toml
#   Ray:      nightly.sh /data/jobs/scans.toml --ray auto
#
# Environment: PANTHEON_OCR (the command, default: pantheon-ocr on PATH),
#              PANTHEON_LOG_DIR (default: logs/ beside the job file).
set -uo pipefail

job=${1:?usage: nightly.sh JOB.toml [archive run options, e.g. --ray auto]}
shift
cmd=${PANTHEON_OCR:-pantheon-ocr}
logdir=${PANTHEON_LOG_DIR:-$(dirname "$job")/logs}
mkdir -p "$logdir" || exit 2
log="$logdir/$(basename "$job" .toml)-$(date +%Y%m%d-%H%M%S).log"

# SIGTERM from cron/systemd reaches the job itself: it records what is done and exits 130.
$cmd archive run "$job" --no-progress "$@" >>"$log" 2>&1
code=$?
if [ "$code" -ne 0 ]; then
    # one line for the cron mail; the log and the HTML report have the details
    echo "pantheon-ocr archive $(basename "$job"): exit $code: $(grep -E '^(error|run [0-9]+ of job|report)' "$log" | tr '\n' ' ')" >&2
fi
exit "$code"
