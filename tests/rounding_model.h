#pragma once
// Note [Equivalence tolerances]
// Every tolerance of an equivalence test (a layout against one process, a resumed run against
// a straight one, a tensor-parallel layer against the plain one) comes from this model of
// what rounding can do, computed from the run's own sizes: none is tuned to the machine or the
// BLAS kernel it was written on. Two runs that do the same arithmetic in another order (another
// dp/ZeRO/pp/tp layout, micro-batching, offload, another OPENBLAS_CORETYPE or thread count)
// differ by rounding only; runs that do it in the same order agree bit for bit
// (RoundingModel::exact).
//
// (1) Reassociation. Reordering a sum of N terms moves it by at most lambda sqrt(N) u sum|x_i|
//     with probability at least 1 - 2N exp(-lambda^2 / 2) (Higham & Mary, "A new approach to
//     probabilistic rounding error analysis", SISC 2019, Thm 3.1), u the unit roundoff (2^-24
//     in fp32). lambda = 8 makes that 1 - 2.5e-14 N: certain for every sum of a test.
// (2) 16 bits. With bf16/fp16 compute both runs round the same fp32 results to 16 bits, so a
//     stored value differs only where an fp32 deviation d carries it across a rounding
//     boundary: with probability d/ulp, by one ulp. That noise has RMS sqrt(d ulp): an
//     effective unit roundoff sqrt(u u16) (2^-16 bf16, 2^-17.5 fp16). A layout that rounds a
//     layer's result at another point (tensor-parallel partial sums rounded once after their
//     sum) may also move a value by one u16 at each of the `depth` layers in sequence, whose
//     independent deviations add to sqrt(depth) u16.
// (3) A step. The loss and the gradients are sums over the step's tokens (N = B T x gas x dp,
//     longer than any width reduction here) of terms that do not cancel much (positive
//     per-token losses; the norm is a sum of squares), so each moves by at most
//         Step() = lambda sqrt(N) u_eff  [+ sqrt(depth) u16 in 16 bits]   (relative).
//     The gradient norm is also a sum of P squares, one per parameter, in an order that
//     depends on the sharding: Norm() = Step() + lambda sqrt(P) u.
// (4) Adam, T steps. An element moves by lr_t (m^/(sqrt(v^) + eps) + wd w) per step. By
//     Cauchy-Schwarz |m^/sqrt(v^)| <= A = max_t (1 - b1) sqrt((1 - g^t) / (1 - g))
//     sqrt(1 - b2^t) / (sqrt(1 - b2) (1 - b1^t)), g = b1^2 / b2 (A = 1 at t = 1; 1.17 for
//     betas (0.9, 0.95), 7.3 for (0.9, 0.999) in the limit), and decoupled decay only
//     shrinks a difference; each step also rounds the updated fp32 value (masters are fp32 in
//     every precision) to within u |w|. So two runs' elements can never be further apart than
//         Ceiling(lr_sum, w) = 2 A sum_t lr_t + 2 T u |w|.
//     That is reached by elements whose gradient is rounding noise, e.g. those that are zero
//     in exact arithmetic (ZeroInExactArithmetic: GPT-2's attention key bias, whose gradient
//     the softmax cancels): they are held to the ceiling only. An element whose gradient
//     stands above its noise sees each update move by at most 2 A Step() (m^ and sqrt(v^)
//     each move by Step() relative), and the two runs round its T updated values
//     independently once their updates differ in any bit, so after T steps it is within
//         Weight(lr_sum, w) = 2 A Step() sum_t lr_t + lambda sqrt(T) u |w|
//     (first order: the runs' weights feeding back into their gradients is neglected).
//     Near-noise elements are few, so Weight, with |w| the RMS of the tensor's values, bounds
//     the RMS of each tensor's deviation, and Ceiling every element. A wrong shard, slice,
//     scale or a missed reduction moves whole rows by O(lr T), which the RMS of any tensor
//     shows at once (one element off by 1e-4 in 16k already doubles a fp32 bound of ~1e-6).
// (5) A later step's loss. Weights that differ by RMS W with random signs move the loss by at
//     most lambda |g| W (the sum of g_i dw_i), |g| the gradient norm: LossAfter() adds that
//     to Step().
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/config.h"

namespace ztrain::testing {

inline constexpr double kRoundingLambda = 8.0;

// The largest |m^ / sqrt(v^)| of bias-corrected Adam within `steps` steps (Note (4)).
inline double AdamUpdateBound(double beta1, double beta2, int64_t steps) {
  const double g = beta1 * beta1 / beta2;
  double a = 1.0;
  for (int64_t t = 1; t <= std::max<int64_t>(steps, 1); ++t) {
    const double td = static_cast<double>(t);
    const double geometric = g == 1.0 ? td : (1.0 - std::pow(g, td)) / (1.0 - g);
    a = std::max(a, (1.0 - beta1) * std::sqrt(geometric) * std::sqrt(1.0 - std::pow(beta2, td)) /
                        (std::sqrt(1.0 - beta2) * (1.0 - std::pow(beta1, td))));
  }
  return a;
}

struct RoundingModel {
  double u = 0x1p-24;  // fp32's unit roundoff
  double u16 = 0.0;    // 16-bit compute: 2^-8 (bf16) or 2^-11 (fp16); 0 in fp32
  int64_t terms = 1;   // N: the longest sum of a step
  int depth = 1;       // layers a value passes in sequence
  int64_t steps = 1;   // T: optimizer steps
  int64_t params = 1;  // P: parameters
  double adam = 1.0;   // A
  bool exact = false;  // the same arithmetic in the same order: bit for bit

  double EffectiveRoundoff() const { return u16 > 0 ? std::sqrt(u * u16) : u; }
  // Relative deviation of a step's loss, gradient norm and gradient elements (Note (3)).
  double Step() const {
    if (exact) return 0.0;
    return kRoundingLambda * std::sqrt(static_cast<double>(terms)) * EffectiveRoundoff() +
           std::sqrt(static_cast<double>(depth)) * u16;
  }
  // Relative deviation of a step's gradient norm.
  double Norm() const {
    if (exact) return 0.0;
    return Step() + kRoundingLambda * std::sqrt(static_cast<double>(params)) * u;
  }
  // A later step's loss, relative, after weights moved by RMS `weight_rms`, with gradient
  // norm `grad_norm` and loss `loss` (Note (5)).
  double LossAfter(double weight_rms, double grad_norm, double loss) const {
    return Step() + kRoundingLambda * grad_norm * weight_rms / std::fabs(loss);
  }
  // RMS over a tensor of the deviation of its elements after steps whose lr sum to `lr_sum`;
  // `w` is the RMS of the tensor's values.
  double Weight(double lr_sum, double w) const {
    if (exact) return 0.0;
    return 2.0 * adam * Step() * lr_sum +
           kRoundingLambda * std::sqrt(static_cast<double>(steps)) * u * w;
  }
  // Every element's deviation, whatever its gradient; `w` is the element's value.
  double Ceiling(double lr_sum, double w) const {
    if (exact) return 0.0;
    return 2.0 * adam * lr_sum + 2.0 * static_cast<double>(steps) * u * std::fabs(w);
  }
};

// The model for training `config` (the single-process run's config), a model of `params`
// parameters, with `tokens` tokens per optimizer step for `steps` steps.
inline RoundingModel ModelFor(const Config& config, int64_t params, int64_t tokens,
                              int64_t steps) {
  RoundingModel m;
  if (config.precision.bf16) m.u16 = 0x1p-8;
  if (config.precision.fp16) m.u16 = 0x1p-11;
  m.terms = std::max<int64_t>(tokens, 1);
  m.depth = config.model.n_layer + 2;  // embedding, blocks, head
  m.steps = std::max<int64_t>(steps, 1);
  m.params = std::max<int64_t>(params, 1);
  m.adam = AdamUpdateBound(config.optimizer.beta1, config.optimizer.beta2, steps);
  return m;
}

// One forward and backward of `ops` operations in sequence (matmuls, norms, softmaxes) whose
// longest sum has `terms` terms: each op moves its results by Step() relative to the largest
// of them (Note (1), (3)), and the deviations of ops in sequence add.
inline double OpsTolerance(int64_t terms, int ops) {
  RoundingModel m;
  m.terms = terms;
  return ops * m.Step();
}

// Elements whose gradient is zero in exact arithmetic, so that a run's value for it is
// rounding noise that Adam turns into steps of about lr either way: the key bias (elements
// [C, 2C) of a block's c_attn.bias), since adding b to every key adds q.b to all of one
// query's scores, which the softmax ignores.
inline bool ZeroInExactArithmetic(const std::string& name, int64_t element, int64_t n_embd) {
  return name.find("attn.c_attn.bias") != std::string::npos && element >= n_embd &&
         element < 2 * n_embd;
}

// Applies Note [Equivalence tolerances] to two runs and keeps the headroom of each check (the
// largest share of its tolerance any value used), which Report prints. Failures are
// collected as messages naming the value; none stops the comparison.
class EquivalenceCheck {
 public:
  EquivalenceCheck(RoundingModel model, int64_t n_embd) : model_(model), n_embd_(n_embd) {}

  // One step: `got` against `want`, where the weights have already moved by lr_sum before it.
  // The weights' deviation is taken at Weight() for values of RMS 1 (no tensor of these
  // models is larger: layernorm gains start at 1, the rest at 0.02).
  void Step(int64_t step, double got_loss, double want_loss, double got_norm, double want_norm,
            double lr_sum_before) {
    const double tol_loss =
        model_.LossAfter(model_.Weight(lr_sum_before, 1.0), want_norm, want_loss) *
        std::fabs(want_loss);
    Use(loss_, got_loss, want_loss, tol_loss, "step " + std::to_string(step) + " loss");
    Use(norm_, got_norm, want_norm, model_.Norm() * std::fabs(want_norm),
        "step " + std::to_string(step) + " gradient norm");
    max_norm_ = std::max(max_norm_, std::fabs(want_norm));
  }
  // A loss evaluated with the final weights, after steps whose lr sum to lr_sum; its gradient
  // norm is taken as the largest a step had.
  void Eval(double got, double want, double lr_sum) {
    Use(loss_, got, want,
        model_.LossAfter(model_.Weight(lr_sum, 1.0), max_norm_, want) * std::fabs(want),
        "eval loss");
  }
  // One tensor's final values after steps whose lr sum to lr_sum.
  void Values(const std::string& name, const float* got, const float* want, int64_t n,
              double lr_sum) {
    double values = 0.0;
    for (int64_t i = 0; i < n; ++i) values += static_cast<double>(want[i]) * want[i];
    const double bound = model_.Weight(lr_sum, std::sqrt(values / static_cast<double>(n)));
    double squares = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
      const double ceiling = model_.Ceiling(lr_sum, want[i]);
      if (!(d <= ceiling)) {  // NaN too
        Fail(ceiling_, d, ceiling,
             name + "[" + std::to_string(i) + "]: " + Text(got[i]) + " vs " + Text(want[i]) +
                 " exceeds Adam's ceiling " + Text(ceiling));
        continue;
      }
      Headroom(ceiling_, d, ceiling);
      if (ZeroInExactArithmetic(name, i, n_embd_)) continue;
      squares += d * d;
      ++counted;
    }
    if (counted == 0) return;
    const double rms = std::sqrt(squares / static_cast<double>(counted));
    if (bound > 0 && rms / bound > rms_) worst_rms_ = name;
    if (!(rms <= bound)) {
      Fail(rms_, rms, bound,
           name + ": RMS deviation " + Text(rms) + " over " + std::to_string(counted) +
               " elements exceeds Weight() = " + Text(bound));
    } else {
      Headroom(rms_, rms, bound);
    }
    ++tensors_;
  }

  const std::vector<std::string>& failures() const { return failures_; }
  int64_t tensors() const { return tensors_; }
  // "rounding model: N 64, Step 3.8e-06, A 1.17, ...; used: losses 2% ..." on stdout.
  void Report(const std::string& label) const {
    std::printf(
        "%s rounding model (Note [Equivalence tolerances]): N %lld, u_eff %.3g, depth %d, "
        "Step %.3g, A %.3f; share of tolerance used at most: losses %.3g, gradient norms "
        "%.3g, weight RMS %.3g (%s), elements of Adam's ceiling %.3g\n",
        label.c_str(), static_cast<long long>(model_.terms), model_.EffectiveRoundoff(),
        model_.depth, model_.Step(), model_.adam, loss_, norm_, rms_, worst_rms_.c_str(), ceiling_);
  }

 private:
  static std::string Text(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return b;
  }
  static void Headroom(double& share, double d, double tol) {
    share = std::max(share, tol > 0 ? d / tol : (d > 0 ? INFINITY : 0.0));
  }
  void Fail(double& share, double d, double tol, const std::string& what) {
    Headroom(share, d, tol);
    failures_.push_back(what);
  }
  void Use(double& share, double got, double want, double tol, const std::string& what) {
    const double d = std::fabs(got - want);
    if (!(d <= tol)) {
      Fail(share, d, tol, what + ": " + Text(got) + " vs " + Text(want) + " (tolerance " +
                              Text(tol) + ")");
    } else {
      Headroom(share, d, tol);
    }
  }

  RoundingModel model_;
  int64_t n_embd_;
  double loss_ = 0, norm_ = 0, rms_ = 0, ceiling_ = 0;
  double max_norm_ = 0;
  std::string worst_rms_;  // the tensor whose RMS used the largest share
  int64_t tensors_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace ztrain::testing
