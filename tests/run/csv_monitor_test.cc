// CsvMonitor after a resume keeps the earlier run's rows up to the resumed step; rows that an
// edit or a cut file left unreadable are dropped instead of ending the run.
#include "run/csv_monitor.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/engine.h"
#include "tests/data/data_test_util.h"

namespace ztrain {
namespace {

TEST(CsvMonitorTest, AResumeKeepsTheRowsUpToItsStepAndDropsUnreadableOnes) {
  data::test_util::TempDir dir;
  const CsvMonitorConfig c{true, dir.path(), "job"};
  {
    CsvMonitor first(c);
    for (int64_t s = 1; s <= 4; ++s) {
      StepStats st;
      st.step = s;
      st.loss = 5.0 - static_cast<double>(s);
      first.Write(st);
    }
  }
  const std::string path = dir.File("job/train.csv");
  std::ofstream(path, std::ios::app) << "garbage,1,2\n,x\n99999999999999999999999,1\n\n";
  CsvMonitor resumed(c, 2);
  StepStats st;
  st.step = 3;
  st.loss = 1.5;
  resumed.Write(st);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u);  // header, steps 1 and 2, the new step 3
  EXPECT_EQ(lines[1].substr(0, 2), "1,");
  EXPECT_EQ(lines[2].substr(0, 2), "2,");
  EXPECT_EQ(lines[3].substr(0, 6), "3,1.5,");
}

}  // namespace
}  // namespace ztrain
