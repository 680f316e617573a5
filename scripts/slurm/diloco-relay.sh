#!/bin/bash
# scripts/slurm/diloco-relay.sh — the DiLoCo hub for replicas on several clusters, run on a
# login or gateway node that every cluster's compute nodes can reach (docs/diloco.md). It
# needs no GPU and little CPU; it restarts itself if it ends, and logs to relay.log.
#   openssl rand -hex 32 > diloco.secret && chmod 600 diloco.secret   # once; copy to every cluster
#   nohup scripts/slurm/diloco-relay.sh 29500 diloco.secret &          # or inside tmux / screen
#   scripts/slurm/diloco-relay.sh 29500 diloco.secret --shards 4       # replicas of 4 ranks; more options: train_gpt relay --help
# Replicas that lose the hub keep training and skip outer steps until it is back; a hub
# restart costs the round in progress, nothing else.
set -u
port=${1:-29500}
secret=${2:-diloco.secret}
extra=("${@:3}")
# The secret's path as given, from where the script was started (the cd below once made a
# relative one unreadable).
case $secret in /*) ;; *) secret=$PWD/$secret ;; esac
cd "$(dirname "$0")/../.."
while :; do
    ./train_gpt relay --listen "0.0.0.0:$port" --secret_file "$secret" ${extra[@]+"${extra[@]}"} >>relay.log 2>&1
    rc=$?
    [ "$rc" -eq 1 ] && { echo "diloco-relay.sh: the relay stopped with an error (see relay.log)" >&2; exit 1; }
    # 126/127: no runnable ./train_gpt here (missing, or built for another machine): no restart helps.
    [ "$rc" -eq 126 ] || [ "$rc" -eq 127 ] && { echo "diloco-relay.sh: ./train_gpt cannot run here (status $rc)" >&2; exit "$rc"; }
    echo "diloco-relay.sh: $(date '+%F %T') the relay ended (status $rc); restarting in 5 s" >>relay.log
    sleep 5
done
