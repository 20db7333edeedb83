// SPDX-License-Identifier: Apache-2.0
// The regions of the C interface: a pinned pool's and a stager's regions listed, described and
// registered through C hooks (a function and a context each), and regions made with
// create_region behind a handle of their own (progress, ready, wait, cancel, slices).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "devstage/region.hpp"
#include "handles.hpp"

using namespace devstage::capi;  // the entry points' helpers
using devstage::Errc;
using devstage::PinnedRegion;
using devstage::RegionHooks;
using devstage::RegionSlice;
using devstage::Result;
using devstage::Status;

namespace {

devstage_region to_c(const PinnedRegion& region) noexcept {
    return devstage_region{
        region.id,
        region.base,
        region.bytes,
        region.numa_node,
        region.kind == devstage::RegionKind::device ? DEVSTAGE_REGION_DEVICE : DEVSTAGE_REGION_PINNED_HOST,
        region.device};
}

// The C hooks as RegionHooks: each calls its function with its context; NULL ones are empty.
RegionHooks from_c(const devstage_region_hooks* hooks) {
    RegionHooks made;
    if (hooks == nullptr) return made;
    if (hooks->added != nullptr) {
        made.added = [added = hooks->added, context = hooks->added_context](const PinnedRegion& region) -> Status {
            const devstage_region c = to_c(region);
            const devstage_status status = added(context, &c);
            if (status == DEVSTAGE_OK) return {};
            const bool known = status > DEVSTAGE_OK && status <= DEVSTAGE_LEAKED;
            return Status(known ? static_cast<Errc>(status) : Errc::backend_failure,
                          devstage::detail::message("the added hook returned ", status, " for region ", region.id));
        };
    }
    if (hooks->removing != nullptr) {
        made.removing = [removing = hooks->removing, context = hooks->removing_context](const PinnedRegion& region) {
            const devstage_region c = to_c(region);
            removing(context, &c);
        };
    }
    return made;
}

// Writes the first min(capacity, listed) regions, and their count.
devstage_status list_out(const char* function, const std::vector<PinnedRegion>& listed, devstage_region* regions,
                         std::size_t capacity, std::size_t* count) {
    if (count == nullptr) return null_argument(function, "count");
    if (regions == nullptr && capacity > 0) return null_argument(function, "regions (with a capacity above 0)");
    const std::size_t n = std::min(capacity, listed.size());
    for (std::size_t i = 0; i < n; ++i) regions[i] = to_c(listed[i]);
    *count = listed.size();
    return report(Status());
}

devstage_status slice_out(const char* function, const char* whose, const void* pointer,
                          const std::optional<RegionSlice>& found, devstage_region_slice* slice) {
    *slice = devstage_region_slice{0, 0, 0};
    if (!found) {
        return fail(Errc::unknown_pointer,
                    devstage::detail::message(function, ": ", pointer, " lies in no region of ", whose));
    }
    *slice = devstage_region_slice{found->region, found->offset, found->bytes};
    return report(Status());
}

template <class Operation>
devstage_status on_pool(const char* function, const devstage_pinned_pool* pool, Operation&& operation) noexcept {
    return guarded(function, [&] {
        PoolState* state = find<PoolState>(pool);
        if (state == nullptr) return bad_handle<PoolState>(function, pool, "pool");
        return operation(*state->pool);
    });
}

template <class Operation>
devstage_status on_stager(const char* function, const devstage_stager* stager, Operation&& operation) noexcept {
    return guarded(function, [&] {
        StagerState* state = find<StagerState>(stager);
        if (state == nullptr) return bad_handle<StagerState>(function, stager);
        return operation(*state->stager);
    });
}

template <class Operation>
devstage_status on_region(const char* function, const devstage_pinned_region* region, Operation&& operation) noexcept {
    return guarded(function, [&] {
        PinnedRegionState* state = find<PinnedRegionState>(region);
        if (state == nullptr) return bad_handle<PinnedRegionState>(function, region, "region");
        return operation(state->region);
    });
}

int state_of(devstage::RegionState state) noexcept {
    switch (state) {
        case devstage::RegionState::registering:
            return DEVSTAGE_REGION_REGISTERING;
        case devstage::RegionState::ready:
            return DEVSTAGE_REGION_READY;
        case devstage::RegionState::failed:
            return DEVSTAGE_REGION_FAILED;
        case devstage::RegionState::cancelled:
            return DEVSTAGE_REGION_CANCELLED;
    }
    return DEVSTAGE_REGION_FAILED;
}

}  // namespace

extern "C" {

devstage_status devstage_pinned_pool_regions(const devstage_pinned_pool* pool, devstage_region* regions,
                                             size_t capacity, size_t* count) {
    const char* function = "devstage_pinned_pool_regions";
    return on_pool(function, pool,
                   [&](const PinnedPool& p) { return list_out(function, p.regions(), regions, capacity, count); });
}

devstage_status devstage_pinned_pool_set_region_hooks(devstage_pinned_pool* pool, const devstage_region_hooks* hooks) {
    return on_pool("devstage_pinned_pool_set_region_hooks", pool,
                   [&](PinnedPool& p) { return report(p.set_region_hooks(from_c(hooks))); });
}

devstage_status devstage_pinned_pool_describe(const devstage_pinned_pool* pool, const void* pointer,
                                              devstage_region_slice* slice) {
    const char* function = "devstage_pinned_pool_describe";
    return on_pool(function, pool, [&](const PinnedPool& p) {
        if (slice == nullptr) return null_argument(function, "slice");
        return slice_out(function, "the pinned pool", pointer, p.describe(pointer), slice);
    });
}

devstage_status devstage_stager_regions(const devstage_stager* stager, devstage_region* regions, size_t capacity,
                                        size_t* count) {
    const char* function = "devstage_stager_regions";
    return on_stager(function, stager,
                     [&](const AnyStager& s) { return list_out(function, s.regions(), regions, capacity, count); });
}

devstage_status devstage_stager_set_region_hooks(devstage_stager* stager, const devstage_region_hooks* hooks) {
    return on_stager("devstage_stager_set_region_hooks", stager,
                     [&](AnyStager& s) { return report(s.set_region_hooks(from_c(hooks))); });
}

devstage_status devstage_stager_describe(const devstage_stager* stager, const void* pointer,
                                         devstage_region_slice* slice) {
    const char* function = "devstage_stager_describe";
    return on_stager(function, stager, [&](const AnyStager& s) {
        if (slice == nullptr) return null_argument(function, "slice");
        return slice_out(function, "the stager", pointer, s.describe(pointer), slice);
    });
}

devstage_status devstage_pinned_region_create(devstage_pinned_pool* pool, size_t bytes, unsigned threads,
                                              devstage_pinned_region** out) {
    const char* function = "devstage_pinned_region_create";
    return guarded(function, [&] {
        if (out == nullptr) return null_argument(function, "out");
        *out = nullptr;
        PoolState* state = find<PoolState>(pool);
        if (state == nullptr) return bad_handle<PoolState>(function, pool, "pool");
        auto made = std::make_unique<PinnedRegionState>();
        made->backend = state->backend;
        Result<devstage::PinnedRegionHandle> region =
            state->pool->create_region(bytes, devstage::RegionOptions{.threads = threads});
        if (!region) return report(region.status());
        made->region = std::move(*region);
        devstage_pinned_region* handle = hand_out(std::move(made));  // on failure the region goes with it
        if (handle == nullptr) return no_handle(function, HandleKind::region);
        *out = handle;
        return report(Status());
    });
}

devstage_status devstage_pinned_region_destroy(devstage_pinned_region* region) {
    return guarded("devstage_pinned_region_destroy", [&] {
        if (region == nullptr) return report(Status());
        PinnedRegionState* state = find<PinnedRegionState>(region);
        if (state == nullptr) return bad_handle<PinnedRegionState>("devstage_pinned_region_destroy", region, "region");
        take_back(region, state);  // the region goes once its last slice is freed
        return report(Status());
    });
}

devstage_status devstage_pinned_region_info(const devstage_pinned_region* region, uint64_t* id, void** base,
                                            size_t* bytes) {
    const char* function = "devstage_pinned_region_info";
    return on_region(function, region, [&](const devstage::PinnedRegionHandle& r) {
        if (id == nullptr) return null_argument(function, "id");
        if (base == nullptr) return null_argument(function, "base");
        if (bytes == nullptr) return null_argument(function, "bytes");
        *id = r.id();
        *base = r.data();
        *bytes = r.size();
        return report(Status());
    });
}

devstage_status devstage_pinned_region_progress(const devstage_pinned_region* region,
                                                devstage_region_progress* progress) {
    const char* function = "devstage_pinned_region_progress";
    return on_region(function, region, [&](const devstage::PinnedRegionHandle& r) {
        if (progress == nullptr) return null_argument(function, "progress");
        const devstage::RegionProgress p = r.progress();
        *progress = devstage_region_progress{p.bytes_registered, p.bytes_total,     p.chunks_registered,
                                             p.chunks_total,     state_of(p.state), p.cancel_requested ? 1 : 0};
        return report(Status());
    });
}

devstage_status devstage_pinned_region_ready(const devstage_pinned_region* region, int* ready) {
    const char* function = "devstage_pinned_region_ready";
    return on_region(function, region, [&](const devstage::PinnedRegionHandle& r) {
        if (ready == nullptr) return null_argument(function, "ready");
        *ready = 0;
        Result<bool> now = r.ready();
        if (!now) return report(now.status());
        *ready = *now ? 1 : 0;
        return report(Status());
    });
}

devstage_status devstage_pinned_region_wait(devstage_pinned_region* region) {
    return on_region("devstage_pinned_region_wait", region,
                     [&](devstage::PinnedRegionHandle& r) { return report(r.wait()); });
}

devstage_status devstage_pinned_region_cancel(devstage_pinned_region* region) {
    return on_region("devstage_pinned_region_cancel", region,
                     [&](devstage::PinnedRegionHandle& r) { return report(r.cancel()); });
}

devstage_status devstage_pinned_region_allocate(devstage_pinned_region* region, size_t bytes, size_t alignment,
                                                void** host) {
    const char* function = "devstage_pinned_region_allocate";
    return on_region(function, region, [&](devstage::PinnedRegionHandle& r) {
        if (host == nullptr) return null_argument(function, "host");
        *host = nullptr;
        Result<void*> slice = r.allocator().allocate(bytes, alignment);
        if (!slice) return report(slice.status());
        *host = *slice;
        return report(Status());
    });
}

devstage_status devstage_pinned_region_free(devstage_pinned_region* region, void* host) {
    return on_region("devstage_pinned_region_free", region,
                     [&](devstage::PinnedRegionHandle& r) { return report(r.allocator().deallocate(host)); });
}

}  // extern "C"
