// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the packed mirror's part in a run's transfers — the Out group zeroed in the mirror
// and the one packed upload at bind, the one packed copy back at finish, and the outputs copied
// out of the mirror once the run completed; none of the copies where the mirror is mapped for
// the device, whose kernel uses it in place.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "devstage/detail/layout/plan_pass.hpp"
#include "devstage/detail/transfer/failures.hpp"
#include "devstage/detail/transfer/run_record.hpp"
#include "devstage/instrumentation.hpp"
#include "devstage/lease.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// A slot's memory as a run's transfers see it: the device buffer's base, and its pinned mirror
/// with the mirror's device address where it is mapped for the device.
struct RunMemory {
    std::byte* base = nullptr;
    std::byte* mirror = nullptr;
    std::size_t mirror_capacity = 0;
    std::byte* mapped = nullptr;
};

/// True when the run's packed args lie in the mapped mirror: its kernel uses them in place.
template <class Async>
bool mapped_run(const RunRecord<Async>& run, const RunMemory& memory) noexcept {
    return memory.mapped != nullptr && run.layout.packed_bytes > 0;
}

/// True when the stream view `A` sets device memory itself (AsyncMemsetBackend, or a
/// MemsetBackend seen through its SynchronousAdapter).
template <class A>
concept SetsDeviceMemory = requires(A& a, void* dst, std::size_t n, typename A::Stream s) {
    { a.device_memset_async(dst, 0, n, s) }
    noexcept->std::same_as<Status>;
};

/// Whether the packed Out group of `run` is zeroed by a device memset rather than in the
/// mirror: only when nothing packed goes up otherwise (no packed In or InOut), the mirror is not
/// mapped and the device sets memory itself — then one memset moves no bytes, where an upload
/// of zeros would. Else the zeros ride in the packed upload, or, mapped, are read in place.
template <class Async>
bool packed_outs_on_device(const RunRecord<Async>& run, const RunMemory& memory) noexcept {
    if constexpr (SetsDeviceMemory<Async>) {
        return !mapped_run(run, memory) && run.layout.upload_end == 0;
    } else {
        (void)run, (void)memory;
        return false;
    }
}

/// What a transfer pass moved (added to the stager's counters by its caller).
struct Moved {
    std::uint64_t bytes = 0, calls = 0;
    bool enqueued = false;     // a call was made on the stream
    bool mirror_used = false;  // enqueued work (or a mapped kernel) reads or writes the mirror
};

/// The copy-backs of a finish: one per copied-back lease (packed ones counted here and moved
/// by one packed copy). The first failure goes to the caller's `first`; the others still run.
struct CopyBacks {
    std::uint64_t calls = 0, failed = 0, packed = 0, bytes = 0;
    std::uint64_t batched = 0;  // copies carried in batch calls beyond one per call
};

/// After the gather: the packed Out group zeroed in the mirror (`zero_outs`), then one upload of
/// every packed In/InOut byte, and of the zeroed Outs with them; none where the mirror is mapped
/// (the kernel reads it in place). Where no packed byte goes up otherwise and the device sets
/// memory itself, the Out group is left to zero_outputs: one memset, no bytes.
template <class Async>
Status packed_upload(Async& async, const RunRecord<Async>& run, const RunMemory& memory, typename Async::Stream stream,
                     bool zero_outs, StagerStats& stats, Moved& moved) noexcept {
    const StagingLayout& layout = run.layout;
    const std::size_t out = layout.base[static_cast<std::size_t>(PackGroup::out)];
    const bool outs =
        layout.base[static_cast<std::size_t>(PackGroup::direct)] > out && !packed_outs_on_device(run, memory);
    if (zero_outs && outs) {
        std::memset(memory.mirror + out, 0, layout.copy_back_end - out);
        stats.host_zeroed_bytes += layout.copy_back_end - out;
    }
    if (mapped_run(run, memory)) {
        moved.mirror_used = true;
        return {};
    }
    const std::size_t bytes = zero_outs && outs ? layout.copy_back_end : layout.upload_end;
    if (bytes == 0) return {};
    if (Status copied = async.copy_to_device_async(memory.base, memory.mirror, bytes, stream); !copied) {
        return copy_failure("bind: packed upload", bytes, copied, async.name());
    }
    moved.enqueued = true;
    moved.mirror_used = true;
    moved.bytes += bytes;
    ++moved.calls;
    return {};
}

/// One copy brings every packed InOut/Out byte back into the mirror; the host copies them out
/// when the run is settled (unpack_outputs).
template <class Async>
Status packed_copy_back(Async& async, const RunRecord<Async>& run, const RunMemory& memory,
                        typename Async::Stream stream, Moved& moved) noexcept {
    const StagingLayout& layout = run.layout;
    const std::size_t bytes = layout.copy_back_end - layout.copy_back_begin;
    Status back = async.copy_from_device_async(memory.mirror + layout.copy_back_begin,
                                               memory.base + layout.copy_back_begin, bytes, stream);
    if (!back) return copy_failure("finish: packed copy back", bytes, back, async.name());
    moved.bytes += bytes;
    ++moved.calls;
    moved.mirror_used = true;
    return back;
}

/// Copies the packed outputs of a completed run from the mirror to the callers' memory (nothing
/// when they are in place: a frame). A backend that checks host accesses is told of the host's
/// reads of a mapped mirror.
template <class B, class Async>
void unpack_outputs(B& backend, const RunRecord<Async>& run, const RunMemory& memory, StagerStats& stats) noexcept {
    const bool mapped = mapped_run(run, memory);
    const std::byte* base = mapped ? memory.mapped : memory.base;
    for (const TensorLease& lease : run.leases()) {
        if (!lease.copy_back || !run.packed(lease)) continue;
        const std::byte* from = memory.mirror + (static_cast<const std::byte*>(lease.device) - base);
        if (lease.host == from) continue;
        if constexpr (HostAccessCheckBackend<B>) {  // the host reads what the kernel wrote in place
            if (mapped) (void)backend.check_host_access(from, lease.bytes, false);
        } else {
            (void)backend;
        }
        std::memcpy(lease.host, from, lease.bytes);
        stats.mirror_copy_bytes += lease.bytes;
    }
}

}  // namespace devstage::detail
