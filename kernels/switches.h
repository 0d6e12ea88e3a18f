// The library's switches: each sends the products or norms it covers to a portable path where a faster
// one would run. They are the only environment variables the library reads, here and nowhere else:
// once per process, the first time any switch is asked. set_switch changes one in process (the tests
// pick a path with it; Python: cuops.switch). Each is documented in README.md.
#pragma once

namespace cuops::kernels {

enum class Switch : int {
  DisableWgmma,  // CUOPS_DISABLE_WGMMA: no sm_90a TMA + wgmma GEMM (the mma.sync kernels run)
  DisableSkinnyTma,  // CUOPS_DISABLE_SKINNY_TMA: no small-M streaming form (per-lane forms; float64 tiles)
  DisableBulkNorm,  // CUOPS_DISABLE_BULK_NORM: two_norm's 16-byte load pass, not the bulk-copy one
};
constexpr int kSwitchCount = 3;

// The switch's name: its environment variable.
const char* switch_name(Switch s);
// The switch named `name`; false if none is.
bool find_switch(const char* name, Switch& s);
// Whether the switch is on: set_switch's last value, else whether its variable is set (to anything).
bool switch_on(Switch s);
// Turns the switch on or off for this process; returns whether it was on. Products planned after the
// call follow it; a CUDA graph captured before keeps the kernels it captured.
bool set_switch(Switch s, bool on);

}  // namespace cuops::kernels
