# Shared by the launcher tests that compare two runs (source it):
#   compare_runs REF.json REF.csv GOT.csv STEPS REF.bin GOT.bin [--exact]
# compares the runs' train.csv (exactly STEPS rows, the same steps) and final llm.c model files
# within Note [Equivalence tolerances] (tests/rounding_model.h), the model from the reference
# run's config REF.json; --exact: bit for bit. It prints how much of each tolerance was used
# and every value out of its tolerance, and returns non-zero on a mismatch. The checker is
# tests/launcher/compare_runs.cc, which CTest names in $ZTRAIN_COMPARE_RUNS.
compare_runs() {
  [ -x "${ZTRAIN_COMPARE_RUNS:-}" ] || { echo "ZTRAIN_COMPARE_RUNS does not name the compare_runs binary"; return 2; }
  "$ZTRAIN_COMPARE_RUNS" --config "$1" --csv "$2" "$3" --steps "$4" --models "$5" "$6" "${@:7}"
}
