#!/bin/bash
# scripts/slurm/diloco-relay.sh — the DiLoCo hub for replicas on several clusters, run on a
# login or gateway node that every cluster's compute nodes can reach (docs/diloco.md). It
# needs no GPU and little CPU; it restarts the relay when it crashes (RESTART_DELAY_S later,
# default 5), and logs to relay.log.
#   openssl rand -hex 32 > diloco.secret && chmod 600 diloco.secret   # once; copy to every cluster
#   nohup scripts/slurm/diloco-relay.sh 29500 diloco.secret &          # or inside tmux / screen
#   scripts/slurm/diloco-relay.sh 29500 diloco.secret --shards 4       # replicas of 4 ranks; more options: train_gpt relay --help
# To stop it: Ctrl-C (tmux / screen), `kill` this script (SIGTERM: it stops its relay, then
# ends), or `kill` the relay (SIGTERM; `kill -9` is a crash, and restarted): the relay stops
# cleanly with status 0 and the script ends with it.
# Replicas that lose the hub keep training and skip outer steps until it is back; a hub
# restart costs the round in progress, nothing else.
set -u
port=${1:-29500}
secret=${2:-diloco.secret}
extra=("${@:3}")
restart_delay_s=${RESTART_DELAY_S:-5}
case $restart_delay_s in
    '' | *[!0-9]*) echo "diloco-relay.sh: RESTART_DELAY_S must be a whole number of seconds, not '$restart_delay_s'" >&2; exit 1 ;;
esac
# The secret's path as given, from where the script was started (the cd below once made a
# relative one unreadable).
case $secret in /*) ;; *) secret=$PWD/$secret ;; esac
cd "$(dirname "$0")/../.."
stopped() {  # stopped WHY [STATUS]: the script ends (status 0 unless given), its relay not restarted
    echo "diloco-relay.sh: $(date '+%F %T') $1; not restarting" | tee -a relay.log >&2
    exit "${2:-0}"
}
# SIGINT or SIGTERM to this script stops its relay too: killed alone (`kill <pid>` after nohup),
# the script once ended and left the relay running, holding the port. The relay runs in the
# background so that the signal is handled at once, not when the relay ends.
relay_pid=
stopping=0
stop_relay() {
    stopping=1
    [ -z "$relay_pid" ] || kill -TERM "$relay_pid" 2>/dev/null
}
trap stop_relay INT TERM
quick_crashes=0   # crashes in a row within QUICK_S of the start: QUICK_MAX of them, a relay that cannot run here
QUICK_S=10
QUICK_MAX=5
while :; do
    started_s=$SECONDS
    ./train_gpt relay --listen "0.0.0.0:$port" --secret_file "$secret" ${extra[@]+"${extra[@]}"} >>relay.log 2>&1 &
    relay_pid=$!
    [ "$stopping" = 0 ] || kill -TERM "$relay_pid" 2>/dev/null   # the signal came before relay_pid was set
    rc=0
    wait "$relay_pid" || rc=$?
    if [ "$stopping" = 1 ]; then
        # wait returned for the signal: the relay is stopping; let it finish.
        while kill -0 "$relay_pid" 2>/dev/null; do wait "$relay_pid" 2>/dev/null; done
        stopped "diloco-relay.sh got SIGINT or SIGTERM and stopped its relay"
    fi
    # 0: the relay was stopped on purpose (SIGINT, SIGTERM; or it only printed --help): it
    # exits 0 on nothing else. Until 2026-12 this loop restarted it, and the new relay held
    # the port against the one meant to replace it.
    [ "$rc" -eq 0 ] && stopped "the relay was stopped (status 0: SIGINT or SIGTERM)"
    [ "$rc" -eq 1 ] && { echo "diloco-relay.sh: the relay stopped with an error (see relay.log)" >&2; exit 1; }
    # 126/127: no runnable ./train_gpt here (missing, or built for another machine): no restart helps.
    [ "$rc" -eq 126 ] || [ "$rc" -eq 127 ] && { echo "diloco-relay.sh: ./train_gpt cannot run here (status $rc)" >&2; exit "$rc"; }
    # 132 (SIGILL): built with -march=native on another CPU; and any crash at start that comes
    # back every time (QUICK_MAX in a row within QUICK_S s of their start): it was restarted for
    # ever, RESTART_DELAY_S apart (107 times in 2 s at 0).
    [ "$rc" -eq 132 ] && stopped "./train_gpt died of SIGILL (status 132): built for another CPU (-march=native); rebuild here, or with make NATIVE=0" "$rc"
    if [ $((SECONDS - started_s)) -lt "$QUICK_S" ]; then quick_crashes=$((quick_crashes + 1)); else quick_crashes=0; fi
    [ "$quick_crashes" -ge "$QUICK_MAX" ] &&
        stopped "the relay crashed (status $rc) within $QUICK_S s of its start $QUICK_MAX times in a row (see relay.log)" "$rc"
    echo "diloco-relay.sh: $(date '+%F %T') the relay ended (status $rc); restarting in $restart_delay_s s" >>relay.log
    sleep "$restart_delay_s" &
    wait $! || { kill $! 2>/dev/null; [ "$stopping" = 0 ] || stopped "diloco-relay.sh got SIGINT or SIGTERM"; }
done
