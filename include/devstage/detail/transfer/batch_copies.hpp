// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the copies of one direction of a run collected for a BatchCopyBackend, and their
// submission — one batch call per batch_copy_limit() copies, a lone copy by itself. A slot keeps
// one BatchCopies; for a backend without batches it is empty and never used.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/detail/transfer/failures.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/detail/util/storage.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class Async>
struct BatchCopies {
    static constexpr bool enabled = false;
    Status size_for(std::size_t /*count*/) noexcept { return {}; }
    void drop() noexcept {}
    std::size_t bytes() const noexcept { return 0; }
};

template <class Async>
requires BatchCopyBackend<Async>
struct BatchCopies<Async> {
    static constexpr bool enabled = true;
    using Stream = typename Async::Stream;

    std::vector<void*> dsts;  // only grow, to the largest run
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    std::size_t count = 0;

    Status size_for(std::size_t args) noexcept {
        if (Status d = grow_storage(dsts, args); !d) return d;
        if (Status s = grow_storage(srcs, args); !s) return s;
        return grow_storage(sizes, args);
    }
    void drop() noexcept {
        count = 0;
        std::vector<void*>().swap(dsts);
        std::vector<const void*>().swap(srcs);
        std::vector<std::size_t>().swap(sizes);
    }
    std::size_t bytes() const noexcept {
        return dsts.capacity() * sizeof(void*) + srcs.capacity() * sizeof(void*) +
               sizes.capacity() * sizeof(std::size_t);
    }

    void clear() noexcept { count = 0; }
    // Within the capacity size_for gave: one per staged arg.
    void add(void* dst, const void* src, std::size_t n) noexcept {
        dsts[count] = dst;
        srcs[count] = src;
        sizes[count] = n;
        ++count;
    }

    // What submit() moved: the calls it made, and the copies and bytes of those that succeeded.
    struct Submitted {
        std::uint64_t calls = 0, copies = 0, bytes = 0;
    };

    // Enqueues the collected copies on `stream`: ceil(count / limit) batch calls, a lone copy as a
    // plain one. `enqueued` is set once a call was made (a batch that fails may have enqueued part
    // of its copies); the first failure stops the submission and names its batch.
    template <bool ToDevice>
    Status submit(Async& async, std::size_t limit, Stream stream, StagerStats& stats, Submitted& done, bool& enqueued,
                  const char* what) noexcept {
        if (count == 0) return {};
        if (count == 1) {
            Status copied = ToDevice ? async.copy_to_device_async(dsts[0], srcs[0], sizes[0], stream)
                                     : async.copy_from_device_async(dsts[0], srcs[0], sizes[0], stream);
            if (!copied) return copy_failure(what, sizes[0], copied, async.name());
            enqueued = true;
            done = Submitted{1, 1, sizes[0]};
            return copied;
        }
        for (std::size_t first = 0; first < count; first += limit) {
            const std::size_t n = count - first < limit ? count - first : limit;
            Status copied = ToDevice
                                ? async.copy_to_device_batch(&dsts[first], &srcs[first], &sizes[first], n, stream)
                                : async.copy_from_device_batch(&dsts[first], &srcs[first], &sizes[first], n, stream);
            enqueued = true;
            if (!copied) return batch_failure(what, first, n, copied, async.name());
            ++done.calls;
            done.copies += n;
            for (std::size_t i = first; i < first + n; ++i) done.bytes += sizes[i];
            if constexpr (ToDevice) {
                ++stats.batched_uploads;
            } else {
                ++stats.batched_copy_backs;
            }
            stats.batched_copies += n;
        }
        return {};
    }

private:
    [[gnu::cold]] Status batch_failure(const char* what, std::size_t first, std::size_t n, const Status& cause,
                                       std::string_view backend) const noexcept {
        std::size_t bytes = 0;
        for (std::size_t i = first; i < first + n; ++i) bytes += sizes[i];
        return Status(cause.code(),
                      message("stager ", what, ": a batch of ", n, " copies (", bytes, " bytes; copies ", first, " to ",
                              first + n - 1, " of ", count, ") failed on backend '", backend, "': ", cause.message()));
    }
};

}  // namespace devstage::detail
