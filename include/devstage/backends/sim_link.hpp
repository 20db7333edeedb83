// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The link model of a SimBackend: what each kind of copy would cost on a real link. Nothing in
/// the sim sleeps; every copy adds its modeled cost to SimStats::modeled_ns instead, so the
/// number of copies a staging scheme makes shows without a device.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <cstddef>
#include <cstdint>
#include <limits>

namespace devstage {

/// The modeled cost of one kind of copy: a fixed per-call latency plus bytes / bandwidth.
/// `bytes_per_second == 0` is an unlimited link (the latency alone).
/// `SimLinkCost{.latency_ns = 4111, .bytes_per_second = 55'300'000'000}`
struct SimLinkCost {
    std::uint64_t latency_ns = 0;
    std::uint64_t bytes_per_second = 0;

    /// latency_ns + bytes / bytes_per_second in nanoseconds, rounded to the nearest
    /// (saturating at the largest std::uint64_t).
    std::uint64_t nanoseconds(std::size_t bytes) const noexcept {
        constexpr auto most = std::numeric_limits<std::uint64_t>::max();
        if (bytes_per_second == 0) return latency_ns;
        const double transfer = static_cast<double>(bytes) * 1e9 / static_cast<double>(bytes_per_second) + 0.5;
        if (transfer >= static_cast<double>(most)) return most;
        const auto rounded = static_cast<std::uint64_t>(transfer);
        return rounded > most - latency_ns ? most : latency_ns + rounded;
    }
};

/// The link model of a SimBackend: one cost per kind of copy. The defaults are the H200 preset
/// (h200()); ascend_a2a3() is the other preset.
/// `SimConfig{.link = SimLinkModel::ascend_a2a3()}`
struct SimLinkModel {
    SimLinkCost to_device_pinned{4111, 55'300'000'000};
    SimLinkCost from_device_pinned{4111, 55'300'000'000};
    SimLinkCost to_device_pageable{4111, 6'850'000'000};
    SimLinkCost from_device_pageable{4111, 6'850'000'000};

    /// The same cost for every kind of copy.
    static constexpr SimLinkModel uniform(SimLinkCost cost) noexcept { return {cost, cost, cost, cost}; }

    /// An NVIDIA H200 on PCIe 5 x16 (CUDA 13 runtime), the defaults; measured figures, derived
    /// in docs/backends.md:
    /// - pinned: 55.3 GB/s each way, a single 1 GiB copy H2D and D2H;
    /// - pageable: 6.85 GB/s, the middle of the 6.5-7.2 GB/s measured for 1 GiB H2D, assumed for
    ///   D2H too;
    /// - every copy 4111 ns per call: a decode step copied per tensor (5 copies, 31.7 us) and
    ///   packed (2 copies, 19.4 us), their bytes at 55.3 GB/s taken off, differ by 3 copies'
    ///   latencies (no per-call figure was measured for pageable copies: assumed equal).
    static constexpr SimLinkModel h200() noexcept { return {}; }

    /// A Huawei Ascend a2a3 (Atlas A2/A3) through CANN, from what hw-native-sys/simpler
    /// publishes for that platform:
    /// - pageable H2D: a synchronous copy of 632 B took 35-39 us and one of 233,799 B 67-68 us
    ///   (its docs/dfx/hbg-bind-phases.md, reference numbers of the Qwen3-14B decode bind:
    ///   arena_h2d and sm_h2d). A line through the two minima (that page reads the quietest
    ///   bind as the machine's own cost): (233,799 - 632) B in (67 - 35) us is 7.29 GB/s, and
    ///   35 us less 632 B at 7.29 GB/s leaves 34,913 ns per call;
    /// - pinned H2D: 19 tensors of 40,859,999,040 B in all, uploaded from aclrtMallocHost
    ///   memory, took 721.6-747.7 ms (54.65-56.63 GB/s: the fastest of six rounds in each of
    ///   five groups, simpler's pull request #1971); the median of the five, 734.871 ms, is
    ///   55.6 GB/s. Its 19 calls cost under 0.1% of that, so 55.6 GB/s is the bandwidth;
    /// - not published, so assumed: a pinned copy costs the pageable per-call latency, and a
    ///   copy from the device costs what the same copy to it does.
    /// The pageable line fits copies of up to a few hundred KB, a decode step's inputs; the
    /// same five groups uploaded the 40.86 GB from pageable memory at 19.1-54.9 GB/s, so the
    /// model makes large pageable copies several times slower than they were.
    static constexpr SimLinkModel ascend_a2a3() noexcept {
        constexpr SimLinkCost pinned{34'913, 55'600'000'000};
        constexpr SimLinkCost pageable{34'913, 7'290'000'000};
        return {pinned, pinned, pageable, pageable};
    }
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
