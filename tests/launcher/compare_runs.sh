# Shared by the launcher tests that compare two runs (source it):
#   compare_losses A.csv B.csv STEPS TOL   train.csv rows: the same steps, losses within TOL
#                                          relative; exactly STEPS rows
#   compare_models A.bin B.bin TOL         llm.c model files: identical 1 KiB headers, every
#                                          weight within TOL (1 + |a|)
# Each prints the first difference and returns non-zero on a mismatch.
compare_losses() {
  paste -d, "$1" "$2" | awk -F, -v cols=7 -v steps="$3" -v tol="$4" '
    NR == 1 { next }
    { a = $2; b = $(cols + 2); d = a - b; if (d < 0) d = -d
      if ($1 != $(cols + 1)) { printf "row %d: step %s vs %s\n", NR, $1, $(cols + 1); bad = 1 }
      if (d > tol * (a < 0 ? -a : a)) { printf "step %s: loss %s vs %s\n", $1, a, b; bad = 1 }
      n++ }
    END { if (n != steps) { print "expected " steps " steps, got " n; exit 1 }; exit bad }'
}

compare_models() {
  cmp -n 1024 "$1" "$2" || { echo "model file headers differ"; return 1; }
  paste <(od -An -v -f -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d') \
        <(od -An -v -f -j 1024 "$2" | tr -s ' ' '\n' | sed '/^$/d') | awk -v tol="$3" '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1
      if (d > tol * (1 + m)) { printf "weight %d: %s vs %s\n", NR, $1, $2; bad = 1; exit }
      n++ }
    END { if (n < 1000) { print "only " n " weights compared"; exit 1 }; exit bad }'
}
