# RT3-2 on the real engine: run from the repo root as `flock /tmp/engine-tests.lock bash tests/redteam3_engine_starvation.sh`.
# Result on dockerd 20.10.24 (overlay2), 2026-11-28: fast:1 alone pulls at once; while drip:1 pulls, its layer sits "Waiting" 25 s (rc=124).
set -u
P=45977
python3 tests/redteam3_drip_registry.py $P 2>/tmp/rt3_registry.log & REG=$!
sleep 1
echo "== control: fast alone"; timeout 20 docker pull 127.0.0.1:$P/fast:1 2>&1 | tail -3; docker rmi 127.0.0.1:$P/fast:1 >/dev/null 2>&1
echo "== drip started"; timeout 40 docker pull 127.0.0.1:$P/drip:1 > /tmp/rt3_drip.out 2>&1 & DRIP=$!
sleep 5
echo "== fast while drip holds the slots"; start=$(date +%s); timeout 25 docker pull 127.0.0.1:$P/fast:1 2>&1 | tail -4; echo "rc=${PIPESTATUS[0]} after $(( $(date +%s)-start )) s"
kill $DRIP 2>/dev/null; wait $DRIP 2>/dev/null
cat /tmp/rt3_drip.out | tail -6
docker rmi 127.0.0.1:$P/fast:1 >/dev/null 2>&1
kill $REG; wait $REG 2>/dev/null
