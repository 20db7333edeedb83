// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The link model of a SimBackend: what each kind of copy would cost on a real link. Nothing in
/// the sim sleeps; every copy adds its modeled cost to SimStats::modeled_ns instead, so the
/// number of copies a staging scheme makes shows without a device.

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

/// The link model of a SimBackend: one cost per kind of copy. The defaults come from the
/// H200 figures in docs/backends.md (pinned: 55.3 GB/s both ways; pageable: 6.85 GB/s, the
/// middle of the measured 6.5–7.2 GB/s host-to-device range, assumed for both ways; every
/// copy 4111 ns per call, derived from the per-tensor and packed decode-step rows).
/// `SimConfig{.link = SimLinkModel::uniform({.latency_ns = 1000})}`
struct SimLinkModel {
    SimLinkCost to_device_pinned{4111, 55'300'000'000};
    SimLinkCost from_device_pinned{4111, 55'300'000'000};
    SimLinkCost to_device_pageable{4111, 6'850'000'000};
    SimLinkCost from_device_pageable{4111, 6'850'000'000};

    /// The same cost for every kind of copy.
    static constexpr SimLinkModel uniform(SimLinkCost cost) noexcept { return {cost, cost, cost, cost}; }
};

}  // namespace devstage
