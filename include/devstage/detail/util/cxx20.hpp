// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: every public header includes this first and compiles its body only under C++20 or
// later, so that an older standard stops with this one error and nothing else.

#if __cplusplus >= 202002L
#define DEVSTAGE_CXX20 1
#else
#define DEVSTAGE_CXX20 0
#error "devstage needs C++20: compile with -std=c++20 or later (g++ 12, clang++ 14)"
#endif
