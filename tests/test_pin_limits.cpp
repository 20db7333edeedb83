// SPDX-License-Identifier: Apache-2.0
// pinned/limits.hpp and a pool that checks big requests against them before pinning anything:
// the cgroup's memory limit read from fake v2 and v1 trees (the tightest on the path), the
// process's CAP_IPC_LOCK and locked bytes read from a fake /proc, RLIMIT_MEMLOCK for memory
// meant for RDMA, and — in a child process with RLIMIT_MEMLOCK set low and CAP_IPC_LOCK
// dropped — the simulator, whose pinning is mlock: its own allocations still work unlocked and
// say so, while a big request past the limit is one clear error with nothing pinned.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"
#include "devstage/pinned.hpp"

using namespace devstage;

namespace {

namespace fs = std::filesystem;

constexpr std::size_t mib = std::size_t{1} << 20;

// AddressSanitizer intercepts mlock and makes it succeed without locking anything, so under it
// a refused mlock cannot be seen.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool mlock_is_real = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool mlock_is_real = false;
#else
constexpr bool mlock_is_real = true;
#endif
#else
constexpr bool mlock_is_real = true;
#endif

/// A fake /proc and cgroup tree in a temporary directory.
struct FakeRoot {
    FakeRoot() {
        char pattern[] = "/tmp/devstage_limits_XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        root = pattern;
        status("0000000000000000", 0);
    }
    FakeRoot(const FakeRoot&) = delete;
    FakeRoot& operator=(const FakeRoot&) = delete;
    ~FakeRoot() { fs::remove_all(root); }
    void write(const std::string& path, const std::string& text) const {
        fs::create_directories(fs::path(root + "/" + path).parent_path());
        std::ofstream(root + "/" + path) << text;
    }
    void status(const std::string& capabilities, std::uint64_t locked_kb) const {
        write("proc/self/status", "Name:\ttest\nVmLck:\t" + std::to_string(locked_kb) + " kB\nVmPin:\t0 kB\nCapEff:\t" +
                                      capabilities + "\n");
    }
    PinLimits limits(bool rdma = false) const {
        return PinLimits{.check = true, .cgroup_root = root + "/cgroup", .proc_root = root + "/proc", .rdma = rdma};
    }
    std::string root;
};

/// Sets RLIMIT_MEMLOCK's soft limit for the scope.
struct MemlockLimit {
    explicit MemlockLimit(rlim_t bytes) {
        REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &saved) == 0);
        rlimit lowered = saved;
        lowered.rlim_cur = bytes;
        REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &lowered) == 0);
    }
    MemlockLimit(const MemlockLimit&) = delete;
    MemlockLimit& operator=(const MemlockLimit&) = delete;
    ~MemlockLimit() { (void)::setrlimit(RLIMIT_MEMLOCK, &saved); }
    rlimit saved{};
};

}  // namespace

TEST_CASE("pin limits: the cgroup's memory limit is the tightest on the process's path, v2 and v1", "[pin_limits]") {
    FakeRoot fake;
    // No cgroup information: no limit.
    CHECK_FALSE(cgroup_memory_limit(fake.limits()).value());
    // cgroup v2: the path and its ancestors; "max" is none.
    fake.write("proc/self/cgroup", "0::/pods/job\n");
    fake.write("cgroup/pods/job/memory.max", "max\n");
    CHECK_FALSE(cgroup_memory_limit(fake.limits()).value());
    fake.write("cgroup/pods/memory.max", "1048576\n");
    auto v2 = cgroup_memory_limit(fake.limits());
    REQUIRE(v2.ok());
    REQUIRE(v2->has_value());
    CHECK((*v2)->bytes == mib);
    CHECK_THAT((*v2)->source, Catch::EndsWith("/cgroup/pods/memory.max"));
    fake.write("cgroup/pods/job/memory.max", "524288\n");
    CHECK(cgroup_memory_limit(fake.limits()).value()->bytes == mib / 2);
    fake.write("cgroup/memory.max", "4096\n");  // the namespace's root, as in a container
    CHECK(cgroup_memory_limit(fake.limits()).value()->bytes == 4096);
    // cgroup v1 where the memory controller is a v1 hierarchy (hybrid machines list both).
    fake.write("proc/self/cgroup", "4:cpu,memory:/batch/x\n0::/\n");
    fake.write("cgroup/memory/batch/x/memory.limit_in_bytes", "9223372036854771712\n");  // none
    fake.write("cgroup/memory/batch/memory.limit_in_bytes", "2097152\n");
    auto v1 = cgroup_memory_limit(fake.limits());
    REQUIRE(v1->has_value());
    CHECK((*v1)->bytes == 2 * mib);
    CHECK_THAT((*v1)->source, Catch::EndsWith("/cgroup/memory/batch/memory.limit_in_bytes"));
    // This machine's own answer parses (whatever it is).
    CHECK(cgroup_memory_limit().ok());
}

TEST_CASE("pin limits: a request is checked against the cgroup's limit with what is pinned already", "[pin_limits]") {
    FakeRoot fake;
    fake.write("proc/self/cgroup", "0::/job\n");
    fake.write("cgroup/job/memory.max", "8388608\n");  // 8 MiB
    CHECK(check_pin_request(4 * mib, 0, fake.limits(), false).ok());
    CHECK(check_pin_request(8 * mib, 0, fake.limits(), false).ok());  // fits exactly
    const Status over = check_pin_request(6 * mib, 3 * mib, fake.limits(), false);
    CHECK(over.code() == Errc::out_of_memory);
    CHECK_THAT(std::string(over.message()),
               Catch::Contains("pinning 6291456 bytes") && Catch::Contains("cgroup's memory limit of 8388608 bytes") &&
                   Catch::Contains("job/memory.max") && Catch::Contains("3145728 bytes are pinned already") &&
                   Catch::Contains("nothing was pinned"));
    // The process's locked memory counts when it is larger than the caller's own.
    fake.status("0000000000000000", 6 * 1024);
    CHECK(check_pin_request(4 * mib, 0, fake.limits(), false).code() == Errc::out_of_memory);
    PinLimits off = fake.limits();
    off.check = false;
    CHECK(check_pin_request(64 * mib, 0, off, false).ok());
}

TEST_CASE("pin limits: RLIMIT_MEMLOCK binds mlock and RDMA pinning, not a process with CAP_IPC_LOCK", "[pin_limits]") {
    FakeRoot fake;
    const MemlockLimit limit(4 * mib);
    fake.status("0000000000000000", 0);
    const std::optional<PinLimit> memlock = memlock_limit(fake.limits());
    REQUIRE(memlock);
    CHECK(memlock->bytes == 4 * mib);
    CHECK(memlock->source == "RLIMIT_MEMLOCK");
    CHECK(check_pin_request(8 * mib, 0, fake.limits(), false).ok());  // neither mlock nor RDMA
    const Status mlocked = check_pin_request(8 * mib, 0, fake.limits(), true);
    CHECK(mlocked.code() == Errc::out_of_memory);
    CHECK_THAT(std::string(mlocked.message()), Catch::Contains("RLIMIT_MEMLOCK of 4194304 bytes"));
    const Status rdma = check_pin_request(8 * mib, 0, fake.limits(true), false);
    CHECK_THAT(std::string(rdma.message()), Catch::Contains("memory for RDMA registration"));
    fake.status("0000000000004000", 0);  // CAP_IPC_LOCK (bit 14): the limit does not bind
    CHECK_FALSE(memlock_limit(fake.limits()));
    CHECK(check_pin_request(8 * mib, 0, fake.limits(true), true).ok());
}

TEST_CASE("pin limits: a pool refuses a big request past a limit before anything is pinned", "[pin_limits]") {
    FakeRoot fake;
    fake.write("proc/self/cgroup", "0::/job\n");
    fake.write("cgroup/job/memory.max", std::to_string(6 * mib) + "\n");
    MockBackend mock;
    PinnedHostPool<MockBackend> pool(mock, {}, PinnedPoolOptions{.exact = {.threshold = mib}, .limits = fake.limits()});
    auto first = pool.allocate(4 * mib);  // fits
    REQUIRE(first.ok());
    CHECK(mock.live_registrations() == 1);  // one chunk: the backend's default is 1 GiB
    const std::uint64_t registers = mock.calls(MockOp::host_register);
    const Result<PinnedBuffer> over = pool.allocate(3 * mib);  // 4 + 3 > 6
    CHECK(over.status().code() == Errc::out_of_memory);
    CHECK_THAT(std::string(over.status().message()), Catch::Contains("pinning 3145728 bytes") &&
                                                         Catch::Contains("6291456 bytes") &&
                                                         Catch::Contains("4194304 bytes are pinned already"));
    const Result<PinnedRegionHandle> region = pool.create_region(3 * mib);
    CHECK(region.status().code() == Errc::out_of_memory);
    CHECK(mock.calls(MockOp::host_register) == registers);  // nothing was pinned
    CHECK(mock.live_pinned_allocations() == 0);
    CHECK(pool.stats().limit_refusals == 2);
    CHECK(pool.stats().locked_bytes == 4 * mib);
    // Requests below the exact threshold take size classes and are not checked.
    CHECK(pool.allocate(1000).ok());
}

TEST_CASE(
    "pin limits: the simulator under a low RLIMIT_MEMLOCK still pins unlocked and says so; a big request "
    "past it is refused, nothing pinned",
    "[pin_limits]") {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        // The child: RLIMIT_MEMLOCK 1 MiB, and CAP_IPC_LOCK dropped (root keeps no way past it).
        int failures = 0;
        const auto expect = [&](bool ok, const char* what) {
            if (ok) return;
            std::fprintf(stderr, "pin limits child: %s\n", what);
            ++failures;
        };
        rlimit low{mib, mib};
        expect(::setrlimit(RLIMIT_MEMLOCK, &low) == 0, "setrlimit");
        struct {
            std::uint32_t version;
            int pid;
        } header{0x20080522, 0};  // _LINUX_CAPABILITY_VERSION_3
        struct {
            std::uint32_t effective, permitted, inheritable;
        } data[2]{};
        expect(::syscall(SYS_capget, &header, data) == 0, "capget");
        data[0].effective &= ~(1U << 14);  // CAP_IPC_LOCK
        data[0].permitted &= ~(1U << 14);
        expect(::syscall(SYS_capset, &header, data) == 0, "capset");
        {
            SimBackend sim;
            Result<void*> pinned = sim.pinned_malloc(4 * mib);  // past the limit: unlocked, and said
            expect(pinned.ok(), "sim pinned_malloc past RLIMIT_MEMLOCK still works");
            if (mlock_is_real) {
                expect(pinned.ok() && !sim.pinned_locked(*pinned), "pinned_locked() says it is not locked");
                expect(sim.stats().pinned_lock_failures == 1, "stats().pinned_lock_failures counts it");
            } else {
                std::fprintf(stderr, "pin limits child: mlock is AddressSanitizer's no-op here: not checked\n");
            }
            if (pinned) (void)sim.pinned_free(*pinned);
            PinnedHostPool<SimBackend> pool(sim, {}, PinnedPoolOptions{.exact = {.threshold = mib}});
            const std::uint64_t pinned_before = sim.stats().live_pinned_bytes;
            const Result<PinnedBuffer> over = pool.allocate(4 * mib);
            expect(over.status().code() == Errc::out_of_memory, "a big request past RLIMIT_MEMLOCK is refused");
            expect(over.status().message().find("RLIMIT_MEMLOCK of 1048576 bytes") != std::string::npos,
                   "the refusal names the limit");
            expect(over.status().message().find("pinning 4194304 bytes") != std::string::npos,
                   "the refusal names the bytes asked for");
            expect(pool.stats().locked_bytes == 0 && sim.stats().live_pinned_bytes == pinned_before,
                   "nothing stays pinned");
            expect(pool.stats().limit_refusals == 1, "the refusal is counted");
            expect(pool.allocate(64 * 1024).ok(), "a small request still takes a size class");
        }
        std::fflush(stderr);
        ::_exit(failures == 0 ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
