#!/usr/bin/env bash
# tests/slurm/slurm-down.sh: stop exactly the daemons slurm-up.sh started
# (PIDs in $BASE/pids), newest first.
BASE=$(realpath -m "${1:?base dir}")
[ -f "$BASE/pids" ] || exit 0
PIDS=$(tac "$BASE/pids")
for p in $PIDS; do kill -TERM "$p" 2>/dev/null || true; done
for _ in $(seq 1 100); do
  alive=0; for p in $PIDS; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive -eq 0 ] && break; sleep 0.1
done
for p in $PIDS; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
rm -f "$BASE/pids"
