// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: random allocate / release / raw release / finalize / trim / buffer-drop
// sequences on a PinnedHostPool over MockBackend, including pointers the pool never gave out.
// After every step the pool's counters agree with a model of what is live.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/pinned.hpp"
#include "fuzz_support.hpp"

using namespace devstage;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    MockBackend mock(MockConfig{.journal = false, .sink = &fuzz::quiet});
    {
        std::optional<PinnedHostPool<MockBackend>> pool;
        pool.emplace(mock, CachingPinned{.max_cached_bytes = 64 << 10});
        pool->set_error_sink(&fuzz::quiet);
        std::vector<PinnedBuffer> buffers;
        std::vector<void*> raw;
        std::byte stranger[8]{};
        for (std::size_t i = 0; i + 2 < size; i += 3) {
            const std::size_t arg = static_cast<std::size_t>(data[i + 1]) << 8 | data[i + 2];
            switch (data[i] % 8) {
                case 0: {
                    auto b = pool->allocate(arg);
                    EXPECT(b.ok() == (arg > 0));
                    if (b) {
                        EXPECT(pool->owns(b->data()) && b->size() == arg);
                        buffers.push_back(std::move(*b));
                    }
                    break;
                }
                case 1: {
                    auto p = pool->allocate_raw(arg + 1);
                    EXPECT(p.ok());
                    raw.push_back(*p);
                    break;
                }
                case 2:
                    if (!buffers.empty())
                        buffers.erase(buffers.begin() + static_cast<std::ptrdiff_t>(arg % buffers.size()));
                    break;
                case 3:
                    if (!raw.empty()) {
                        const std::size_t k = arg % raw.size();
                        EXPECT(pool->release(raw[k]).ok());
                        EXPECT(pool->release(raw[k]).code() == Errc::unknown_pointer);  // twice
                        raw.erase(raw.begin() + static_cast<std::ptrdiff_t>(k));
                    }
                    break;
                case 4:
                    EXPECT(pool->release(stranger + arg % 8).code() == Errc::unknown_pointer);
                    break;
                case 5:
                    EXPECT(pool->finalize().ok());
                    raw.clear();  // freed by finalize: the buffers become inert
                    EXPECT(pool->stats().live_allocations == 0);
                    break;
                case 6:
                    EXPECT(pool->trim().ok());
                    EXPECT(pool->stats().cached_bytes == 0);
                    break;
                default:
                    if (arg % 4 == 0) {
                        pool.reset();  // the pool dies; buffers outlive it
                        raw.clear();
                        pool.emplace(mock, CachingPinned{.max_cached_bytes = 64 << 10});
                        pool->set_error_sink(&fuzz::quiet);
                    }
                    break;
            }
            const PinnedStats stats = pool->stats();
            EXPECT(stats.cached_bytes <= (64 << 10));
            EXPECT(stats.backend_allocations - stats.backend_frees == stats.live_allocations + stats.cached_blocks);
            EXPECT(mock.misuses() == 0);
        }
        buffers.clear();  // some after their pool finalized or died: harmless
    }
    EXPECT(mock.live_pinned_allocations() == 0);
    return 0;
}
