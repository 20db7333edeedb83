// SPDX-License-Identifier: Apache-2.0
// Sequential equivalence: random engine programs, compared byte for byte with their synchronous run.
#include <catch2/catch.hpp>
