// Early return of a failed absl::Status.
#pragma once

#include "absl/status/status.h"

#define TC_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    if (absl::Status tc_s = (expr); !tc_s.ok()) { \
      return tc_s;                                \
    }                                             \
  } while (0)
