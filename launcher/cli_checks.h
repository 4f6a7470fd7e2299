#pragma once
// Checks of the command line's numbers that say the range in words. CLI11's own
// (PositiveNumber, Range) answer "Value 0 not in range 0.000000 to 1797693134862315708...".
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

namespace ztrain::launcher {

// A number in [low, high] (`open_low`: above low); the message names the value and the
// range as a person would write it.
inline CLI::Validator NumberIn(double low, double high, bool open_low, std::string words) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(value.c_str(), &end);
        if (value.empty() || end == value.c_str() || *end != '\0' || std::isnan(x)) {
          return "'" + value + "' is not a number; give " + words;
        }
        const bool ok = (open_low ? x > low : x >= low) && x <= high;
        return ok ? std::string() : "must be " + words + ", got " + value;
      },
      words);
}

inline const CLI::Validator kPositive = NumberIn(0, HUGE_VAL, true, "above 0");
inline const CLI::Validator kNonNegative = NumberIn(0, HUGE_VAL, false, "0 or more");
inline const CLI::Validator kProbability = NumberIn(0, 1, false, "between 0 and 1");

}  // namespace ztrain::launcher
