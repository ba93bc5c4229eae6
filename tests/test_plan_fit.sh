# When no layout fits, `dtrain plan` shows the nearest layout (least memory per rank) against
# the budget and what makes one fit (issue 23, item 7): each suggestion, given back to
# plan, gives a layout that fits; the exit stays 2 with the one error line; --json carries
# the same as one object. Offload (docs/offload.md): where only it fits, plan says so and
# its suggestions, given back to plan, fit too.
source "$(dirname "$0")/lib.sh"
P=(plan --config "$SRC/configs/gpt2-small.json" --flops 1e10 --memory 2)
"$DTRAIN" "${P[@]}" -n 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "no layout of 2 ranks fits in 2.0 GB per rank" "$TMP/err" &&
  grep -qE '^nearest: dp[0-9]+ pp[0-9]+ cp[0-9]+ tp[0-9]+ z[0-3] needs [0-9.]+ MB per rank, [0-9.]+ MB over the budget of 2000.0 MB' "$TMP/out" &&
  pass "GPT-2 small on 2 ranks in 2 GB: exit 2, $(grep nearest "$TMP/out")" || fail "nothing fits: rc $rc: $(cat "$TMP/out" "$TMP/err")"
n=0
while IFS= read -r line; do
  args=$(sed -E 's/^fits with (.*) \(.*$/\1/' <<<"$line")
  read -ra A <<<"$args"
  world=(-n 2); [ "${A[0]}" = -n ] && world=()
  "$DTRAIN" "${P[@]}" "${world[@]}" "${A[@]}" >"$TMP/again" 2>&1 && fit=$(grep -oE ': [0-9]+ layouts fit' "$TMP/again") &&
    [ "${fit//[^0-9]/}" -gt 0 ] && n=$((n + 1)) && pass "suggestion '$args' plans a layout that fits ($fit)" ||
    fail "suggestion '$args': $(tail -2 "$TMP/again")"
done < <(grep '^fits with ' "$TMP/out")
[ $n -ge 3 ] && grep -q '^fits with -n ' "$TMP/out" && grep -q 'train.recompute=full' "$TMP/out" &&
  pass "$n suggestions, more ranks and recompute among them" || fail "suggestions: $(cat "$TMP/out")"
"$DTRAIN" "${P[@]}" -n 2 --json >"$TMP/json" 2>/dev/null; rc=$?
python3 - "$TMP/json" "$TMP/out" <<'PY' && [ $rc -eq 2 ] && pass "--json: the same as one object" || fail "--json: rc $rc: $(cat "$TMP/json")"
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
a = json.loads(lines[0])
text = open(sys.argv[2]).read()
assert a["fits"] is False and a["world"] == 2 and a["budget"] == 2e9
assert a["nearest"]["memory"] > a["budget"]
assert "%.1f MB per rank" % (a["nearest"]["memory"] / 1e6) in text
args = re.findall(r"^fits with (.*) \(", text, re.M)
assert [s["args"] for s in a["suggestions"]] == args, (args, a["suggestions"])
for s in a["suggestions"]:
    assert s["layout"]["memory"] <= a["budget"], s
PY
# --- offload: GPT-2 small, one sequence of 128 tokens per micro-batch, so the 16 bytes per
# parameter of its state outweigh the activations
Q=(plan --config "$SRC/configs/gpt2-small.json" --flops 1e10 --set train.micro_batch=1 --set train.seq_len=128)
# replan LABEL BASE...: every "fits with" line of $TMP/out, given back to plan with BASE, fits
replan() {
  local label=$1 line args; shift
  while IFS= read -r line; do
    args=$(sed -E 's/^fits with (.*) \(.*$/\1/' <<<"$line")
    read -ra A <<<"$args"
    "$DTRAIN" "$@" "${A[@]}" >"$TMP/again" 2>&1 && grep -qE ': [1-9][0-9]* layouts fit' "$TMP/again" &&
      pass "$label: '$args' plans a layout that fits ($(grep -oE '[0-9]+ layouts fit' "$TMP/again"))" ||
      fail "$label: suggestion '$args': $(tail -2 "$TMP/again")"
  done < <(grep '^fits with --set offload' "$TMP/out")
}
"$DTRAIN" "${Q[@]}" --memory 1.0 -n 2 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
  grep -qE '^fits with --set offload.optimizer=nvme --set offload.param=nvme \(ZeRO-Infinity.*\): dp2 pp1 cp1 tp1 z3, ' "$TMP/out" &&
  grep -q '^only offload fits on 2 ranks: train.recompute=full, a smaller micro-batch and bf16 do not' "$TMP/out" &&
  ! grep -q 'offload.optimizer=cpu' "$TMP/out" &&
  pass "2 ranks in 1 GB (CPU backend): only NVMe offload fits, ZeRO-3; host-memory offload not offered (the same memory)" ||
  fail "nvme suggestion: rc $rc: $(cat "$TMP/out" "$TMP/err")"
replan "cpu backend" "${Q[@]}" --memory 1.0 -n 2
"$DTRAIN" "${Q[@]}" --memory 1.0 -n 2 --json >"$TMP/json" 2>/dev/null
python3 -c "import json,sys; a=json.load(open(sys.argv[1])); s=[x for x in a['suggestions'] if x['change']=='offload_nvme']; assert a['only_offload'] is True and len(s)==1 and s[0]['layout']['zero']==3, a" "$TMP/json" &&
  pass "--json: only_offload, the offload_nvme suggestion on ZeRO-3" || fail "offload --json: $(cat "$TMP/json")"
"$DTRAIN" "${Q[@]}" --memory 1.5 -n 1 --set backend=emulated >"$TMP/out" 2>&1
grep -qE '^fits with --set offload.optimizer=cpu \(ZeRO-Offload.*\): dp1 pp1 cp1 tp1 z0, ' "$TMP/out" &&
  grep -q '^only offload fits on 1 rank:' "$TMP/out" &&
  pass "1 device rank in 1.5 GB: the optimizer state in host memory fits" || fail "cpu suggestion: $(cat "$TMP/out")"
replan "device backend" "${Q[@]}" --memory 1.5 -n 1 --set backend=emulated
finish
