// SPDX-License-Identifier: Apache-2.0
#pragma once
// The strategies the staging suites (staging_suite.hpp, async_staging_suite.hpp) stage a
// backend type with: the library's RetainedBump (without packing, and with PackSmall<4096>),
// unless the type is a WithStrategies<Backend, Retained, Packed> — the backend itself, naming
// the retained strategy and the packing one the suites use instead (a user-written strategy).

#include <cstddef>
#include <memory>
#include <type_traits>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "support.hpp"

namespace devstage::test {

template <class B>
struct SuiteStrategies {
    using retained = RetainedBump<>;
    using packed = RetainedBump<ExactGrowth, 1024, PackSmall<4096>>;
};

/// `Inner` (MockBackend or SimBackend) staged by the suites with `Retained` and `Packed`.
template <class Inner, class Retained, class Packed>
class WithStrategies : public Inner {
public:
    using Inner::Inner;
};

template <class Inner, class Retained, class Packed>
struct SuiteStrategies<WithStrategies<Inner, Retained, Packed>> {
    using retained = Retained;
    using packed = Packed;
};

template <class B>
using RetainedOf = typename SuiteStrategies<B>::retained;
template <class B>
using PackedOf = typename SuiteStrategies<B>::packed;

template <class Inner, class Retained, class Packed>
struct BackendFactory<WithStrategies<Inner, Retained, Packed>> {
    using Made = WithStrategies<Inner, Retained, Packed>;
    static std::unique_ptr<Made> make(std::size_t capacity = std::size_t{1} << 32) {
        if constexpr (std::is_same_v<Inner, SimBackend>) {
            return std::make_unique<Made>(SimConfig{.device_capacity = capacity});
        } else {
            return std::make_unique<Made>(MockConfig{.device_capacity = capacity});
        }
    }
};

}  // namespace devstage::test
