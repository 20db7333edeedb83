// SPDX-License-Identifier: Apache-2.0
// The Qwen3 decode input set: one table, two storages, identical bytes; generated in pinned
// memory it stages with no bounce, generated in pageable memory every byte bounces.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>

#include "devstage/backends/sim.hpp"
#include "devstage/stager.hpp"
#include "qwen3_decode.hpp"

using namespace devstage;

TEST_CASE("qwen3: the table has the 19 tensors at the model's dimensions", "[qwen3]") {
    const auto specs = qwen3::table();
    STATIC_REQUIRE(qwen3::tensor_count == 19);
    std::set<std::string_view> names;
    std::size_t full = 0;
    for (const auto& spec : specs) {
        names.insert(spec.name);
        full += spec.bytes_at(1.0);
    }
    CHECK(names.size() == 19);
    CHECK(specs[2].bytes_at(1.0) == std::size_t{40} * 5120 * 5120 * 2);  // q_proj, 40 layers, bf16
    CHECK(full > (std::size_t{30} << 30));                               // tens of GB at full size
    CHECK(specs[0].bytes_at(0.001) == specs[0].bytes_at(1.0));           // batch-shaped: not scaled
}

TEST_CASE("qwen3: pinned and pageable generation give the same bytes", "[qwen3]") {
    SimBackend sim;
    PinnedHostPool<SimBackend> pool(sim);
    qwen3::PinnedStorage pinned_storage(pool);
    qwen3::PageableStorage pageable_storage;
    const qwen3::Inputs pinned = qwen3::generate(pinned_storage, 0.0005, 7);
    const qwen3::Inputs pageable = qwen3::generate(pageable_storage, 0.0005, 7);
    REQUIRE(pinned.ok());
    REQUIRE(pageable.ok());
    REQUIRE(pinned.total_bytes == pageable.total_bytes);
    for (std::size_t i = 0; i < qwen3::tensor_count; ++i) {
        CAPTURE(pinned.names[i]);
        REQUIRE(pinned.args[i].bytes == pageable.args[i].bytes);
        CHECK(std::memcmp(pinned.args[i].data, pageable.args[i].data, pinned.args[i].bytes) == 0);
        CHECK(sim.is_pinned(pinned.args[i].data));
        CHECK_FALSE(sim.is_pinned(pageable.args[i].data));
    }
}

TEST_CASE("qwen3: pinned inputs stage without a bounce; pageable ones bounce every byte", "[qwen3]") {
    SimBackend sim;
    PinnedHostPool<SimBackend> pool(sim);
    Stager<SimBackend> stager(sim);
    const auto stage_once = [&](const qwen3::Inputs& inputs) {
        auto run = stager.bind(inputs.args);
        REQUIRE(run.ok());
        REQUIRE(stager.finish(std::move(*run)).ok());
    };
    qwen3::PinnedStorage pinned_storage(pool);
    const qwen3::Inputs pinned = qwen3::generate(pinned_storage, 0.0005);
    REQUIRE(pinned.ok());
    stage_once(pinned);
    const SimStats after_pinned = sim.stats();
    CHECK(after_pinned.bounced_bytes == 0);
    CHECK(after_pinned.direct_bytes == stager.stats().bytes_to_device + stager.stats().bytes_from_device);
    CHECK(stager.stats().bytes_to_device > 0);

    qwen3::PageableStorage pageable_storage;
    const qwen3::Inputs pageable = qwen3::generate(pageable_storage, 0.0005);
    REQUIRE(pageable.ok());
    const std::uint64_t moved_before = stager.stats().bytes_to_device + stager.stats().bytes_from_device;
    stage_once(pageable);
    const std::uint64_t moved = stager.stats().bytes_to_device + stager.stats().bytes_from_device - moved_before;
    CHECK(sim.stats().bounced_bytes == moved);
    CHECK(sim.stats().direct_bytes == after_pinned.direct_bytes);
}
