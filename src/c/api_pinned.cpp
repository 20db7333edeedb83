// SPDX-License-Identifier: Apache-2.0
// The pinned-pool entry points of the C interface: a PinnedHostPool over a C backend, handing
// out raw pointers.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

#include "devstage/c/devstage.h"
#include "devstage/detail/util/message.hpp"
#include "handles.hpp"

using namespace devstage::capi;  // the entry points' helpers
using devstage::Errc;
using devstage::Result;
using devstage::Status;

namespace {

// Runs `operation(state, pool)` on a pool handle that must be live.
template <class Operation>
devstage_status on_pool(const char* function, const devstage_pinned_pool* pool, Operation&& operation) noexcept {
    return guarded(function, [&] {
        PoolState* state = find<PoolState>(pool);
        if (state == nullptr) return bad_handle<PoolState>(function, pool, "pool");
        return operation(*state, *state->pool);
    });
}

}  // namespace

extern "C" {

devstage_status devstage_pinned_pool_create(devstage_backend* backend, size_t max_cached_bytes,
                                            devstage_pinned_pool** out) {
    return guarded("devstage_pinned_pool_create", [&] {
        return created<PoolState>("devstage_pinned_pool_create", backend, out, [&](PoolState& state) {
            if (!state.backend->has_pinned()) {
                return Status(Errc::not_supported,
                              devstage::detail::message("devstage_pinned_pool_create: backend '", state.backend->name(),
                                                        "' has no pinned host memory (no "
                                                        "pinned_malloc and pinned_free callbacks)"));
            }
            state.pool = std::make_unique<PinnedPool>(*state.backend, devstage::CachingPinned{max_cached_bytes});
            state.pool->set_error_sink(state.sink.sink());
            return Status();
        });
    });
}

devstage_status devstage_pinned_pool_destroy(devstage_pinned_pool* pool) {
    return destroyed<PoolState>("devstage_pinned_pool_destroy", pool, &PoolState::pool);
}

devstage_status devstage_pinned_pool_set_error_sink(devstage_pinned_pool* pool, devstage_error_sink sink,
                                                    void* context) {
    return on_pool("devstage_pinned_pool_set_error_sink", pool, [&](PoolState& state, PinnedPool& p) {
        state.sink.function = sink;
        state.sink.context = context;
        p.set_error_sink(state.sink.sink());
        return report(Status());
    });
}

devstage_status devstage_pinned_pool_allocate(devstage_pinned_pool* pool, size_t bytes, void** host) {
    return on_pool("devstage_pinned_pool_allocate", pool, [&](PoolState&, PinnedPool& p) {
        if (host == nullptr) return null_argument("devstage_pinned_pool_allocate", "host");
        *host = nullptr;
        Result<void*> memory = p.allocate_raw(bytes);
        if (!memory) return report(memory.status());
        *host = *memory;
        return report(Status());
    });
}

devstage_status devstage_pinned_pool_free(devstage_pinned_pool* pool, void* host) {
    return on_pool("devstage_pinned_pool_free", pool,
                   [&](PoolState&, PinnedPool& p) { return report(p.release(host)); });
}

devstage_status devstage_pinned_pool_record(devstage_pinned_pool* pool, const void* host, devstage_stream stream) {
    return on_pool("devstage_pinned_pool_record", pool, [&](PoolState& state, PinnedPool& p) {
        StreamState* s = find<StreamState>(stream);
        if (s == nullptr) return bad_handle<StreamState>("devstage_pinned_pool_record", stream);
        const BackendPtr& owner = s->owner->backend;
        if (owner.get() == state.backend.get()) return report(p.record(host, s->native));
        // A stream of another backend (another device): its events are made on that backend,
        // which the pool then keeps alive.
        {
            std::lock_guard lock(state.peers_mutex);
            if (std::find(state.peers.begin(), state.peers.end(), owner) == state.peers.end()) {
                state.peers.push_back(owner);
            }
        }
        return report(p.record(host, s->native, *owner));
    });
}

devstage_status devstage_pinned_pool_trim(devstage_pinned_pool* pool) {
    return on_pool("devstage_pinned_pool_trim", pool, [&](PoolState&, PinnedPool& p) { return report(p.trim()); });
}

devstage_status devstage_pinned_pool_stats(const devstage_pinned_pool* pool, devstage_pinned_stats* stats) {
    return on_pool("devstage_pinned_pool_stats", pool, [&](PoolState&, const PinnedPool& p) {
        if (stats == nullptr) return null_argument("devstage_pinned_pool_stats", "stats");
        const devstage::PinnedStats s = p.stats();
        *stats = devstage_pinned_stats{s.live_allocations, s.live_bytes,     s.peak_live_bytes, s.cached_blocks,
                                       s.cached_bytes,     s.cache_hits,     s.cache_misses,    s.backend_allocations,
                                       s.backend_frees,    s.pending_blocks, s.pending_bytes};
        return report(Status());
    });
}

}  // extern "C"
