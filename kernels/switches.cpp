#include "switches.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace cuops::kernels {
namespace {

constexpr const char* kNames[kSwitchCount] = {"CUOPS_DISABLE_WGMMA", "CUOPS_DISABLE_SKINNY_TMA",
                                              "CUOPS_DISABLE_BULK_NORM"};
std::atomic<bool> g_on[kSwitchCount];

// The environment, read once per process.
void read_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < kSwitchCount; ++i) g_on[i].store(std::getenv(kNames[i]) != nullptr);
  });
}

}  // namespace

const char* switch_name(Switch s) { return kNames[static_cast<int>(s)]; }

bool find_switch(const char* name, Switch& s) {
  for (int i = 0; i < kSwitchCount; ++i) {
    if (std::strcmp(name, kNames[i]) == 0) {
      s = static_cast<Switch>(i);
      return true;
    }
  }
  return false;
}

bool switch_on(Switch s) {
  read_environment();
  return g_on[static_cast<int>(s)].load(std::memory_order_relaxed);
}

bool set_switch(Switch s, bool on) {
  read_environment();
  return g_on[static_cast<int>(s)].exchange(on);
}

}  // namespace cuops::kernels
