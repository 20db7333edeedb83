// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: random sequences of buffer, raw, container (PinnedAllocator and
// PinnedMemoryResource) and over-aligned allocations and releases, finalize, trim and pool
// deaths on PinnedHostPools over MockBackend, including pointers the pool never gave out, and
// copies enqueued on two streams from buffers, raw allocations and containers that record()
// the stream before giving the memory back — over the eager mock and the deferred one, whose
// copies run only when the host synchronizes. Every other pool pins requests from 8 KiB at their
// exact size in 4 KiB chunks, and regions made with create_region hand out buffers (recorded and
// given back like any other) while their handles come and go. Buffers and containers outlive
// finalize() and their pool: their bytes must stay as written, a container of a dead pool must
// refuse to grow, every copy must deliver the bytes it was enqueued with (a block handed out or
// freed before its copy ran would show), every buffer must lie in a region the pool describes,
// and after every step the mock's pinned and registered bytes must be exactly what the cores
// still alive hold locked.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <memory_resource>
#include <new>
#include <optional>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/pinned.hpp"
#include "fuzz_support.hpp"

using namespace devstage;

namespace {

using Words = std::vector<std::uint32_t, PinnedAllocator<std::uint32_t>>;

struct HeldBuffer {
    PinnedBuffer buffer;
    std::uint8_t fill;
    std::uint64_t generation;  // of the pool it came from
};
struct HeldRaw {
    void* pointer;
    std::size_t bytes;
};
struct HeldWords {  // words[i] == seed + i
    Words words;
    std::uint32_t seed;
    std::uint64_t generation;  // of the pool it allocates from
};
struct HeldPmr {  // values[i] == seed ^ i
    std::pmr::vector<std::uint64_t> values;
    std::uint64_t seed;
    std::uint64_t generation;
};
struct HeldAligned {
    PinnedMemoryResource* resource;
    void* pointer;
    std::size_t bytes;
    std::size_t alignment;
};

bool intact(const HeldBuffer& held) {
    const auto* bytes = static_cast<const std::uint8_t*>(held.buffer.data());
    return held.buffer.size() == 0 || (bytes[0] == held.fill && bytes[held.buffer.size() - 1] == held.fill);
}
bool intact(const HeldWords& held) {
    for (std::size_t i = 0; i < held.words.size(); ++i) {
        if (held.words[i] != held.seed + static_cast<std::uint32_t>(i)) return false;
    }
    return true;
}
bool intact(const HeldPmr& held) {
    for (std::size_t i = 0; i < held.values.size(); ++i) {
        if (held.values[i] != (held.seed ^ i)) return false;
    }
    return true;
}

// Grows `container` to `size` elements; false when its allocator refused (std::bad_alloc).
template <class Container, class Value>
bool grow(Container& container, std::size_t size, Value value) {
    try {
        container.reserve(size);
    } catch (const std::bad_alloc&) {
        return false;
    }
    for (std::size_t i = container.size(); i < size; ++i) container.push_back(value(i));
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    MockBackend mock(MockConfig{.offset = size % 2 == 0 ? 0 : MockBackend::device_alignment,
                                .journal = false,
                                .sink = &fuzz::quiet,
                                .deferred_async = size / 2 % 2 == 1});
    // Copies go to device slots, each used once until verify() synchronizes and checks them.
    constexpr std::size_t slot_bytes = 256, slots = 64;
    auto* const device = static_cast<std::byte*>(*mock.device_malloc(slots * slot_bytes));
    const MockBackend::Stream streams[] = {*mock.create_stream(), *mock.create_stream()};
    std::vector<std::vector<std::byte>> expected;  // what each used slot must end holding
    const auto verify = [&] {
        EXPECT(mock.synchronize().ok());
        std::vector<std::byte> got(slot_bytes);
        for (std::size_t k = 0; k < expected.size(); ++k) {
            EXPECT(mock.copy_from_device(got.data(), device + k * slot_bytes, expected[k].size()).ok());
            EXPECT(std::equal(expected[k].begin(), expected[k].end(), got.begin()));
        }
        expected.clear();
    };
    // Enqueues a copy of the first bytes at `host` to the next slot; the caller records it.
    const auto upload = [&](const void* host, std::size_t bytes, MockBackend::Stream stream) {
        if (expected.size() == slots) verify();
        const auto* first = static_cast<const std::byte*>(host);
        const std::size_t n = std::min(bytes, slot_bytes);
        expected.emplace_back(first, first + n);
        EXPECT(mock.copy_to_device_async(device + (expected.size() - 1) * slot_bytes, host, n, stream).ok());
    };
    {
        // Declared first, so every container and aligned block dies before the resources.
        std::vector<std::unique_ptr<PinnedMemoryResource>> resources;
        std::vector<std::weak_ptr<detail::PinnedCore>> cores;
        std::optional<PinnedHostPool<MockBackend>> pool;
        std::uint64_t generation = 0;
        const auto open_pool = [&] {
            const bool exact = generation % 2 == 1;
            pool.emplace(mock, CachingPinned{.max_cached_bytes = 64 << 10},
                         PinnedPoolOptions{.exact = {.threshold = exact ? std::size_t{8192} : 0, .chunk_bytes = 4096}});
            pool->set_error_sink(&fuzz::quiet);
            cores.push_back(pool->core());
            resources.push_back(std::make_unique<PinnedMemoryResource>(*pool));
            ++generation;
        };
        open_pool();
        std::vector<HeldBuffer> buffers;
        std::vector<HeldRaw> raw;
        std::vector<HeldWords> words;
        std::list<HeldPmr> pmrs;  // a list: erasing moves no pmr vector (that would allocate)
        std::vector<HeldAligned> aligned;
        std::vector<std::pair<PinnedRegionHandle, std::uint64_t>> regions;  // and their pool's generation
        std::byte stranger[8]{};
        for (std::size_t i = 0; i + 2 < size; i += 3) {
            const std::size_t arg = static_cast<std::size_t>(data[i + 1]) << 8 | data[i + 2];
            const MockBackend::Stream stream = streams[data[i] / 16 % 2];
            switch (data[i] % 16) {
                case 0: {
                    auto b = pool->allocate(arg);
                    EXPECT(b.ok() == (arg > 0));
                    if (b) {
                        EXPECT(pool->owns(b->data()) && b->size() == arg);
                        const auto fill = static_cast<std::uint8_t>(arg * 7 + 1);
                        std::memset(b->data(), fill, arg);
                        buffers.push_back(HeldBuffer{std::move(*b), fill, generation});
                    }
                    break;
                }
                case 1: {
                    auto p = pool->allocate_raw(arg + 1);
                    EXPECT(p.ok());
                    std::memset(*p, static_cast<int>(arg * 3 + 2) & 0xFF, arg + 1);
                    raw.push_back(HeldRaw{*p, arg + 1});
                    break;
                }
                case 2:
                    if (!buffers.empty()) {
                        const std::size_t k = arg % buffers.size();
                        EXPECT(intact(buffers[k]));
                        buffers.erase(buffers.begin() + static_cast<std::ptrdiff_t>(k));
                    }
                    break;
                case 3:
                    if (!raw.empty()) {
                        const std::size_t k = arg % raw.size();
                        EXPECT(pool->release(raw[k].pointer).ok());
                        EXPECT(pool->release(raw[k].pointer).code() == Errc::unknown_pointer);  // twice
                        raw.erase(raw.begin() + static_cast<std::ptrdiff_t>(k));
                    }
                    break;
                case 4:
                    EXPECT(pool->release(stranger + arg % 8).code() == Errc::unknown_pointer);
                    if (!words.empty() && !words[arg % words.size()].words.empty()) {
                        // A container's memory is its allocator's to give back.
                        const HeldWords& held = words[arg % words.size()];
                        EXPECT(pool->release(const_cast<std::uint32_t*>(held.words.data())).code() ==
                               (held.generation == generation ? Errc::invalid_argument : Errc::unknown_pointer));
                    }
                    break;
                case 5: {
                    EXPECT(pool->finalize().ok());
                    const PinnedStats stats = pool->stats();
                    EXPECT(stats.cached_bytes == 0);
                    EXPECT(stats.detached_allocations == stats.live_allocations);  // all kept, none freed
                    break;
                }
                case 6:
                    EXPECT(pool->trim().ok());
                    EXPECT(pool->stats().cached_bytes == 0);
                    break;
                case 7:
                    if (arg % 4 == 0) {
                        pool.reset();  // the pool dies; buffers, containers and regions outlive it
                        raw.clear();   // freed by the destruction: nothing could release them now
                        open_pool();
                    }
                    break;
                case 8: {  // a container grows, or a new one starts
                    const std::size_t target = arg % 2048;
                    if (words.empty() || arg % 3 == 0) {
                        words.push_back(HeldWords{Words(PinnedAllocator<std::uint32_t>(*pool)),
                                                  static_cast<std::uint32_t>(arg * 2654435761u), generation});
                    }
                    HeldWords& held = words[arg % words.size()];
                    const bool needs_memory = target > held.words.capacity();
                    const bool grew = grow(held.words, target, [&held](std::size_t k) {
                        return held.seed + static_cast<std::uint32_t>(k);
                    });
                    // Only a container whose pool died may be refused (the mock has no limit).
                    EXPECT(grew || (needs_memory && held.generation != generation));
                    EXPECT(intact(held));
                    break;
                }
                case 9:
                    if (!words.empty() && arg % 2 == 0) {
                        // Erasing move-assigns the containers after it, across pools: the
                        // allocator travels with the memory, so nothing is allocated.
                        const std::size_t k = arg % words.size();
                        EXPECT(intact(words[k]));
                        words.erase(words.begin() + static_cast<std::ptrdiff_t>(k));
                    } else if (!pmrs.empty()) {
                        const auto k = std::next(pmrs.begin(), static_cast<std::ptrdiff_t>(arg % pmrs.size()));
                        EXPECT(intact(*k));
                        pmrs.erase(k);
                    }
                    break;
                case 10: {  // a pmr container grows, or a new one starts
                    const std::size_t target = arg % 1024;
                    if (pmrs.empty() || arg % 3 == 0) {
                        pmrs.push_back(HeldPmr{std::pmr::vector<std::uint64_t>(resources.back().get()),
                                               static_cast<std::uint64_t>(arg) * 0x9E3779B97F4A7C15u, generation});
                    }
                    HeldPmr& held = *std::next(pmrs.begin(), static_cast<std::ptrdiff_t>(arg % pmrs.size()));
                    const bool needs_memory = target > held.values.capacity();
                    const bool grew = grow(held.values, target, [&held](std::size_t k) { return held.seed ^ k; });
                    EXPECT(grew || (needs_memory && held.generation != generation));
                    EXPECT(intact(held));
                    break;
                }
                case 11:  // a region: made, a buffer carved out of it, or its handle dropped
                    if (arg % 4 == 0 && !regions.empty()) {
                        regions.erase(regions.begin() + static_cast<std::ptrdiff_t>(arg % regions.size()));
                    } else if (arg % 4 == 1 && regions.size() < 4) {
                        Result<PinnedRegionHandle> region = pool->create_region(arg % 16384 + 1);
                        EXPECT(region.ok());
                        EXPECT(region->ready().value());
                        regions.emplace_back(std::move(*region), generation);
                    } else if (!regions.empty()) {
                        auto& [region, born] = regions[arg % regions.size()];
                        auto b = region.allocate(arg % 2048 + 1, std::size_t{1} << (arg % 7));
                        // A full region refuses, and one whose pool died hands out nothing more.
                        EXPECT(b.ok() || b.status().code() == Errc::out_of_memory ||
                               (born != generation && b.status().code() == Errc::invalid_argument));
                        if (b) {
                            const auto fill = static_cast<std::uint8_t>(arg * 5 + 3);
                            std::memset(b->data(), fill, b->size());
                            const bool current = pool->owns(b->data());
                            buffers.push_back(HeldBuffer{std::move(*b), fill, current ? generation : 0});
                        }
                    }
                    break;
                case 12:  // a copy from a buffer, recorded; a buffer of a dead pool is refused
                    if (arg % 16 == 0) {
                        EXPECT(pool->record(PinnedBuffer(), stream).code() == Errc::invalid_argument);
                    } else if (!buffers.empty()) {
                        const HeldBuffer& held = buffers[arg % buffers.size()];
                        if (held.generation == generation) {
                            upload(held.buffer.data(), held.buffer.size(), stream);
                            EXPECT(pool->record(held.buffer, stream).ok());
                        } else {
                            EXPECT(pool->record(held.buffer, stream).code() == Errc::invalid_argument);
                        }
                    }
                    break;
                case 13:  // a copy from a raw allocation, recorded
                    if (!raw.empty()) {
                        const HeldRaw& held = raw[arg % raw.size()];
                        upload(held.pointer, held.bytes, stream);
                        EXPECT(pool->record(held.pointer, stream).ok());
                    }
                    break;
                case 14:  // a copy from a container's elements, recorded; the container may grow later
                    if (!words.empty() && !words[arg % words.size()].words.empty()) {
                        const HeldWords& held = words[arg % words.size()];
                        if (held.generation == generation) {
                            upload(held.words.data(), held.words.size() * sizeof(std::uint32_t), stream);
                            EXPECT(pool->record(held.words.data(), stream).ok());
                        } else {
                            EXPECT(pool->record(held.words.data(), stream).code() == Errc::unknown_pointer);
                        }
                    }
                    break;
                case 15:
                    verify();
                    break;
                default:  // an over-aligned block, or one given back
                    if (arg % 2 == 0 || aligned.empty()) {
                        const std::size_t alignment = std::size_t{1} << (arg % 17);
                        const std::size_t bytes = arg % 5000;
                        void* pointer = resources.back()->allocate(bytes, alignment);
                        EXPECT(detail::is_aligned(pointer, alignment));
                        std::memset(pointer, 0xC3, bytes);
                        aligned.push_back(HeldAligned{resources.back().get(), pointer, bytes, alignment});
                    } else {
                        const HeldAligned held = aligned[arg % aligned.size()];
                        held.resource->deallocate(held.pointer, held.bytes, held.alignment);
                        aligned.erase(aligned.begin() + static_cast<std::ptrdiff_t>(arg % aligned.size()));
                    }
                    break;
            }
            std::uint64_t locked = 0;
            for (const auto& weak : cores) {
                const std::shared_ptr<detail::PinnedCore> core = weak.lock();
                if (!core) continue;  // gone: nothing held it, so nothing of it may be left
                const PinnedStats stats = core->stats();
                EXPECT(stats.cached_bytes <= (64 << 10));
                EXPECT(stats.pending_blocks <= stats.cached_blocks + stats.retiring_blocks);
                locked += stats.locked_bytes;
            }
            EXPECT(mock.live_pinned_bytes() + mock.live_registered_bytes() == locked);
            if (pool && !buffers.empty()) {  // every pinned byte handed out lies in a region
                const HeldBuffer& held = buffers[arg % buffers.size()];
                if (held.generation == generation) {
                    const std::optional<RegionSlice> slice = pool->describe(held.buffer.data());
                    EXPECT(slice && slice->bytes >= held.buffer.size());
                }
            }
            EXPECT(mock.misuses() == 0);
        }
        for (const HeldBuffer& held : buffers) EXPECT(intact(held));
        for (const HeldWords& held : words) EXPECT(intact(held));
        for (const HeldPmr& held : pmrs) EXPECT(intact(held));
        for (const HeldAligned& held : aligned) held.resource->deallocate(held.pointer, held.bytes, held.alignment);
        buffers.clear();  // some after their pool finalized or died
        words.clear();
        pmrs.clear();
        regions.clear();
    }
    verify();
    EXPECT(mock.live_pinned_allocations() == 0);
    EXPECT(mock.live_registrations() == 0);
    EXPECT(mock.live_events() == 0);  // every pool destroyed the events it made
    EXPECT(mock.misuses() == 0);
    EXPECT(mock.device_free(device).ok());
    for (const auto stream : streams) EXPECT(mock.destroy_stream(stream).ok());
    return 0;
}
