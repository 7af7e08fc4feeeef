#!/usr/bin/env bash
# Builds heapdump, runs the C example under it, snapshots it and shows the profile.
# Usage: bash examples/demo.sh        (needs cargo, gcc and go: apt-get install golang-go gcc)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null; then
  echo "demo: installing golang-go for go tool pprof" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
fi
cargo build --release
mkdir -p target/demo
cc -O1 -g -fno-omit-frame-pointer -o target/demo/known_allocs examples/c/known_allocs.c
# Keep the program's stdin open until we are done, so its blocks stay live.
coproc PROG { target/release/heapdump run -- target/demo/known_allocs; }
read -r _ pid <&"${PROG[0]}"
target/release/heapdump list
target/release/heapdump snapshot --by-pid "$pid" -o target/demo/known_allocs.pb.gz
go tool pprof -top -sample_index=inuse_space target/demo/known_allocs.pb.gz
exec {PROG[1]}>&-
wait "$PROG_PID"
echo
echo "Open it in a browser with: go tool pprof -http=: target/demo/known_allocs.pb.gz"
