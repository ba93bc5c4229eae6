# docs/model.md states the model's and the training's exact semantics; this checks the
# statements against the program: the constants it quotes are the source's, the
# learning-rate formula reproduces the metrics' lr at every step (warmup, cosine, the
# 1-based step convention), grad_norm is reported before clipping, validation runs at
# the documented steps.
source "$(dirname "$0")/lib.sh"
prepare_tiny
DOC="$SRC/docs/model.md"
[ -f "$DOC" ] || { fail "docs/model.md is missing"; finish; exit 1; }
# constants quoted in the doc, and where the source has them
check_const() { # doc-pattern source-file source-pattern label
  grep -qF -- "$1" "$DOC" && grep -qF -- "$3" "$SRC/$2" && pass "$4: doc '$1' = source '$3'" \
    || fail "$4: doc has '$1'? source $2 has '$3'?"
}
check_const "sqrt(var + 1e-5)" src/backend/cpu/layernorm.c "v / C + 1e-5f" "LayerNorm eps"
check_const "0.044715 · x³" src/backend/cpu/elementwise.c "0.044715f * x * x * x" "GELU (tanh form)"
check_const "σ = 0.02 / sqrt(2 · L)" src/model/gpt.c "0.02f / sqrtf(2.0f * (float)n_layer)" "residual init scale"
check_const "(q_t · k_u) / sqrt(hs)" src/backend/cpu/attention.c "sqrtf" "attention scale"
for sec in "## Learning-rate schedule" "## Gradient norm and clipping" "## AdamW" "## Validation"; do
  grep -qF "$sec" "$DOC" && pass "section '$sec'" || fail "docs/model.md lacks '$sec'"
done
# the schedule, as documented, against a run (steps 30, warmup 7, stopped early at 24 to
# show stop_after keeps the schedule of train.steps); clip 0.01 so that clipping is active
"$DTRAIN" train "${TINY[@]}" --steps 30 --set train.warmup_steps=7 --set train.lr=1e-3 --set train.min_lr=1e-4 \
  --set train.stop_after=24 --set train.grad_clip=0.01 --set train.val_every=10 --metrics "$TMP/m.jsonl" >/dev/null 2>&1 \
  || fail "run"
python3 - "$TMP/m.jsonl" <<'PY' && pass "metrics' lr follows the documented formula; grad_norm is before clipping; val at 10, 20, 24" \
  || fail "schedule/clip/val semantics differ from docs/model.md"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "event" not in r]
lr, min_lr, W, S = 1e-3, 1e-4, 7, 30
def lr_at(s):
    if s < W: return lr * (s + 1) / W
    if S - W <= 0: return lr
    p = min(1.0, (s - W) / (S - W))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))
assert [r["step"] for r in steps] == list(range(1, 25))
for r in steps:
    want = lr_at(r["step"] - 1)
    assert abs(r["lr"] - want) <= 1e-6 * want, (r["step"], r["lr"], want)
assert steps[W - 1]["lr"] == steps[W]["lr"] == max(r["lr"] for r in steps)  # steps W and W+1 at the peak
# clip = 0.01 is active on every step, yet the reported norms are far above it
assert min(r["grad_norm"] for r in steps) > 0.05, min(r["grad_norm"] for r in steps)
vals = [r["step"] for r in rows if r.get("event") == "val"]
assert vals == [10, 20, 24], vals
PY
finish
