// SPDX-License-Identifier: Apache-2.0
// HostRegisterBackend: existing host memory pinned in place, on the simulator, the mock (at the
// call and deferred) and CudaBackend over the stand-in runtime; the errors a runtime reports —
// null, empty, twice, overlapping, unknown, inside a range — as the same codes everywhere; what
// being registered changes (is_pinned, the simulator's direct copies); the mock's journal,
// faults, pending-work check and leak report.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/backends/ascend.hpp"
#include "devstage/backends/cuda.hpp"
#include "devstage/backends/mock.hpp"
#include "devstage/backends/sim.hpp"

using devstage::Errc;
using devstage::MockBackend;
using devstage::MockConfig;
using devstage::MockOp;
using devstage::SimBackend;

static_assert(devstage::HostRegisterBackend<SimBackend>);
static_assert(devstage::HostRegisterBackend<MockBackend>);
static_assert(devstage::HostRegisterBackend<devstage::CudaBackend>);
// aclrtHostRegister maps host memory for the device and does not pin it for copies.
static_assert(!devstage::HostRegisterBackend<devstage::AscendBackend>);

namespace {

// Page-aligned host memory of the test's own (pageable until registered).
struct HostBlock {
    explicit HostBlock(std::size_t n) : bytes(n), data(static_cast<std::byte*>(std::aligned_alloc(4096, n))) {
        REQUIRE(data != nullptr);
        std::memset(data, 0, n);
    }
    HostBlock(const HostBlock&) = delete;
    HostBlock& operator=(const HostBlock&) = delete;
    ~HostBlock() { std::free(data); }
    std::size_t bytes;
    std::byte* data;
};

// The checks every HostRegisterBackend makes, with the same codes.
template <class B>
void registration_errors(B& backend) {
    HostBlock block(4 * 4096);
    std::byte* const host = block.data;
    CHECK(backend.host_register(nullptr, 64).code() == Errc::invalid_argument);
    CHECK(backend.host_register(host, 0).code() == Errc::invalid_argument);
    CHECK(backend.host_unregister(host).code() == Errc::unknown_pointer);  // never registered
    REQUIRE(backend.host_register(host + 4096, 2 * 4096).ok());
    const devstage::Status twice = backend.host_register(host + 4096, 2 * 4096);
    CHECK(twice.code() == Errc::invalid_argument);
    CHECK(twice.message().find("regist") != std::string::npos);
    CHECK(backend.host_register(host, 4096 + 1).code() == Errc::invalid_argument);             // runs into it
    CHECK(backend.host_register(host + 2 * 4096, 64).code() == Errc::invalid_argument);        // inside it
    CHECK(backend.host_register(host + 4096 - 8, 3 * 4096).code() == Errc::invalid_argument);  // covers it
    CHECK(backend.host_unregister(host + 2 * 4096).code() == Errc::unknown_pointer);           // not its start
    REQUIRE(backend.host_register(host, 4096).ok());                                           // adjacent: fine
    REQUIRE(backend.host_register(host + 3 * 4096, 4096).ok());
    CHECK(backend.host_unregister(host + 4096).ok());
    CHECK(backend.host_unregister(host + 4096).code() == Errc::unknown_pointer);  // twice
    CHECK(backend.host_unregister(host).ok());
    CHECK(backend.host_unregister(host + 3 * 4096).ok());
    // Registered again after unregistering.
    REQUIRE(backend.host_register(host, block.bytes).ok());
    CHECK(backend.host_unregister(host).ok());
}

const char* cuda_shim_path() {
    const char* path = std::getenv("DEVSTAGE_CUDA_SHIM_LIBRARY");
    return path != nullptr ? path : "libcudart_shim.so";
}

}  // namespace

TEST_CASE("host register: the simulator pins in place; is_pinned and its copies follow", "[host_register]") {
    SimBackend sim;
    registration_errors(sim);
    HostBlock block(64 * 1024);
    void* device = *sim.device_malloc(block.bytes);
    CHECK_FALSE(sim.is_pinned(block.data));
    CHECK(sim.copy_to_device(device, block.data, block.bytes).ok());
    const std::uint64_t bounced = sim.stats().bounced_bytes;
    CHECK(bounced == block.bytes);
    REQUIRE(sim.host_register(block.data, block.bytes).ok());
    CHECK(sim.is_pinned(block.data));
    CHECK(sim.is_pinned(block.data + block.bytes - 1));
    CHECK_FALSE(sim.is_pinned(block.data + block.bytes));
    const std::uint64_t direct = sim.stats().direct_bytes;
    auto stream = sim.create_stream();
    REQUIRE(stream);
    std::memset(block.data, 7, block.bytes);
    CHECK(sim.copy_to_device_async(device, block.data, block.bytes, *stream).ok());
    CHECK(sim.synchronize().ok());
    CHECK(sim.stats().direct_bytes == direct + block.bytes);  // no bounce: the copy reads it directly
    CHECK(sim.stats().bounced_bytes == bounced);
    std::vector<std::byte> back(block.bytes);
    CHECK(sim.copy_from_device(back.data(), device, back.size()).ok());
    CHECK(back[100] == std::byte{7});
    CHECK(sim.host_unregister(block.data).ok());
    CHECK_FALSE(sim.is_pinned(block.data));
    // The sim's own pinned memory is pinned already.
    void* pinned = *sim.pinned_malloc(8192);
    CHECK(sim.host_register(pinned, 100).code() == Errc::invalid_argument);
    CHECK(sim.host_register(static_cast<std::byte*>(pinned) - 4096, 8192).code() == Errc::invalid_argument);
    CHECK(sim.pinned_free(pinned).ok());
    CHECK(sim.has_stream(*stream));
    CHECK(sim.destroy_stream(*stream).ok());
    CHECK_FALSE(sim.has_stream(*stream));
    CHECK(sim.device_free(device).ok());
}

TEST_CASE("host register: the mock checks, journals, fails on demand and reports leaks", "[host_register]") {
    MockBackend mock;
    registration_errors(mock);
    CHECK(mock.calls(MockOp::host_register) == 10);
    CHECK(mock.calls(MockOp::host_unregister) == 7);
    CHECK(mock.misuses() == 9);
    HostBlock block(8192);
    mock.fail_call(MockOp::host_register, mock.calls(MockOp::host_register) + 1);
    CHECK(mock.host_register(block.data, 64).code() == Errc::backend_failure);
    REQUIRE(mock.host_register(block.data, 64).ok());
    const std::vector<devstage::MockCall> journal = mock.journal();
    REQUIRE_FALSE(journal.empty());
    CHECK(journal.back().op == MockOp::host_register);
    CHECK(journal.back().pointer == block.data);
    CHECK(journal.back().bytes == 64);
    CHECK(mock.leak_report().find("leaked host registration of 64 bytes") != std::string::npos);
    CHECK(mock.host_unregister(block.data).ok());
    CHECK(mock.leak_report().empty());
    void* pinned = *mock.pinned_malloc(4096);
    CHECK(mock.host_register(pinned, 64).code() == Errc::invalid_argument);
    CHECK(mock.pinned_free(pinned).ok());
}

TEST_CASE("host register: the deferred mock refuses to unpin what pending copies use", "[host_register]") {
    MockBackend mock(MockConfig{.deferred_async = true});
    HostBlock block(4096);
    REQUIRE(mock.host_register(block.data, block.bytes).ok());
    void* device = *mock.device_malloc(block.bytes);
    auto stream = mock.create_stream();
    REQUIRE(stream);
    REQUIRE(mock.copy_to_device_async(device, block.data, block.bytes, *stream).ok());
    CHECK(mock.host_unregister(block.data).code() == Errc::busy);
    CHECK(mock.synchronize().ok());
    CHECK(mock.host_unregister(block.data).ok());
    CHECK(mock.destroy_stream(*stream).ok());
    CHECK(mock.device_free(device).ok());
}

TEST_CASE("host register: CudaBackend registers portably through the runtime", "[host_register]") {
    auto gpu = devstage::CudaBackend::create(0, cuda_shim_path());
    REQUIRE(gpu);
    registration_errors(*gpu);
    HostBlock block(4096);
    CHECK_FALSE(gpu->is_pinned(block.data));
    REQUIRE(gpu->host_register(block.data, block.bytes).ok());
    CHECK(gpu->is_pinned(block.data));  // cudaPointerGetAttributes: host memory
    const devstage::Status twice = gpu->host_register(block.data, 64);
    CHECK(twice.code() == Errc::invalid_argument);
    CHECK(twice.message().find("cudaHostRegister") != std::string::npos);
    CHECK(twice.message().find("712") != std::string::npos);
    CHECK(gpu->host_unregister(block.data).ok());
    const devstage::Status unknown = gpu->host_unregister(block.data);
    CHECK(unknown.code() == Errc::unknown_pointer);
    CHECK(unknown.message().find("713") != std::string::npos);
    // The backend's own pinned memory is registered already, as CUDA says.
    void* pinned = *gpu->pinned_malloc(4096);
    CHECK(gpu->host_register(pinned, 64).code() == Errc::invalid_argument);
    CHECK(gpu->pinned_free(pinned).ok());
}
