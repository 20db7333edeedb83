// SPDX-License-Identifier: Apache-2.0
// pinned/numa.hpp and a PinnedHostPool with NumaPlacement: the topology read from a fake sysfs
// tree of 2 nodes, binding checked with get_mempolicy on this machine's real nodes, and a node
// this machine lacks refused and fallen back from. What the machine has decides which of the
// two outcomes a bind to node 1 must have; both are checked.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/pinned/numa.hpp"
#include "devstage/pinned/pool.hpp"

using namespace devstage;

namespace {

namespace fs = std::filesystem;

/// A fake sysfs: nodes 0-1 online, three PCI devices on node 0, node 1 and none.
struct FakeSysfs {
    FakeSysfs() {
        char pattern[] = "/tmp/devstage_numa_XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        root = pattern;
        write("devices/system/node/online", "0-1\n");
        write("bus/pci/devices/0000:17:00.0/numa_node", "0\n");
        write("bus/pci/devices/0000:65:00.0/numa_node", "1\n");
        write("bus/pci/devices/0000:b3:00.0/numa_node", "-1\n");
        write("bus/pci/devices/0000:ca:00.0/numa_node", "near\n");
    }
    FakeSysfs(const FakeSysfs&) = delete;
    FakeSysfs& operator=(const FakeSysfs&) = delete;
    ~FakeSysfs() { fs::remove_all(root); }
    void write(const std::string& path, const std::string& text) const {
        fs::create_directories(fs::path(root + "/" + path).parent_path());
        std::ofstream(root + "/" + path) << text;
    }
    std::string root;
};

/// Whether this machine has NUMA node `node` (the real sysfs).
bool machine_has_node(int node) {
    return fs::exists("/sys/devices/system/node/node" + std::to_string(node));
}

/// A mock that says where it sits on the PCI bus (as CudaBackend's pci_bus_id()).
class PciMock : public MockBackend {
public:
    explicit PciMock(std::string address = {}) : address_(std::move(address)) {}
    Result<std::string> pci_bus_id() const noexcept {
        if (address_.empty()) return Status(Errc::not_supported, "pci mock: no address");
        return address_;
    }

private:
    std::string address_;
};
static_assert(PciAddressQuery<PciMock> && !NumaNodeQuery<PciMock> && !PciAddressQuery<MockBackend>);

struct NodeMock : MockBackend {
    int node = -1;
    Result<int> host_numa_node() const noexcept { return node; }
    Result<std::string> pci_bus_id() const noexcept { return std::string("0000:65:00.0"); }
};
static_assert(NumaNodeQuery<NodeMock> && PciAddressQuery<NodeMock>);

std::vector<std::string> numa_reports;
void numa_sink(const Status& status) noexcept {
    numa_reports.emplace_back(status.message());
}

}  // namespace

TEST_CASE("numa: the topology is read from sysfs, and bad input is a clear error", "[numa]") {
    FakeSysfs sysfs;
    const Result<std::vector<int>> online = numa_online_nodes(sysfs.root);
    REQUIRE(online.ok());
    CHECK(*online == std::vector<int>{0, 1});
    sysfs.write("devices/system/node/online", "0,2-3\n");
    CHECK(numa_online_nodes(sysfs.root).value() == std::vector<int>{0, 2, 3});
    sysfs.write("devices/system/node/online", "3-1\n");
    CHECK(numa_online_nodes(sysfs.root).status().code() == Errc::invalid_argument);
    CHECK(numa_online_nodes(sysfs.root + "/absent").status().code() == Errc::not_supported);
    const Result<std::vector<int>> real = numa_online_nodes();  // this machine: at least node 0
    REQUIRE(real.ok());
    CHECK(real->front() == 0);

    CHECK(numa_node_of_pci("0000:17:00.0", sysfs.root).value() == 0);
    CHECK(numa_node_of_pci("0000:65:00.0", sysfs.root).value() == 1);
    CHECK(numa_node_of_pci("0000:B3:00.0", sysfs.root).value() == -1);  // CUDA's case, sysfs's
    const Result<int> garbage = numa_node_of_pci("0000:ca:00.0", sysfs.root);
    CHECK(garbage.status().code() == Errc::invalid_argument);
    CHECK_THAT(std::string(garbage.status().message()), Catch::Contains("'near' is not a node number"));
    const Result<int> absent = numa_node_of_pci("0000:99:00.0", sysfs.root);
    CHECK(absent.status().code() == Errc::not_supported);
    CHECK_THAT(std::string(absent.status().message()), Catch::Contains("0000:99:00.0/numa_node"));
    CHECK(numa_node_of_pci("../../etc", sysfs.root).status().code() == Errc::invalid_argument);
    CHECK(numa_node_of_pci("00000000:65:00.0", sysfs.root).value() == 1);  // an 8-digit domain

    // The runtime's answer first, sysfs by PCI address next, none last.
    NodeMock said;
    said.node = 0;
    CHECK(nearest_numa_node(said, sysfs.root).value() == 0);
    said.node = -1;
    CHECK(nearest_numa_node(said, sysfs.root).value() == 1);  // its PCI address is on node 1
    CHECK(nearest_numa_node(PciMock("0000:17:00.0"), sysfs.root).value() == 0);
    CHECK(nearest_numa_node(PciMock(), sysfs.root).status().code() == Errc::not_supported);
    CHECK(nearest_numa_node(MockBackend(), sysfs.root).value() == -1);
}

TEST_CASE("numa: a PCI address is dddd:bb:dd.f and nothing else; path components are refused", "[numa]") {
    FakeSysfs sysfs;
    // What a path component would reach if it passed: <root>/bus/pci/numa_node.
    sysfs.write("bus/pci/numa_node", "0\n");
    sysfs.write("bus/pci/devices/numa_node", "0\n");
    struct Row {
        const char* address;
        Errc expected;
    };
    const Row rows[] = {
        {"", Errc::invalid_argument},
        {"..", Errc::invalid_argument},
        {".", Errc::invalid_argument},
        {"17", Errc::invalid_argument},
        {":::", Errc::invalid_argument},
        {"0000:17:00", Errc::invalid_argument},       // no function
        {"17:00.0", Errc::invalid_argument},          // no domain
        {"0000:17:00.8", Errc::invalid_argument},     // functions are 0-7
        {"0000:17:00.0/..", Errc::invalid_argument},  // a path component after it
        {"0000:17/../00.0", Errc::invalid_argument},
        {"000:17:00.0", Errc::invalid_argument},        // a 3-digit domain
        {"000000000:17:00.0", Errc::invalid_argument},  // a 9-digit domain
        {"0000:117:00.0", Errc::invalid_argument},
        {"0000:g7:00.0", Errc::invalid_argument},
        {" 0000:17:00.0", Errc::invalid_argument},
        {"0000:17:00.0 ", Errc::invalid_argument},
        {"0000:99:00.0", Errc::not_supported},  // well formed, not in sysfs
        {"0000:17:00.0", Errc::ok},
        {"0000:17:00.7", Errc::not_supported},
        {"00000000:17:00.0", Errc::ok},
        {"0000:B3:00.0", Errc::ok},
    };
    for (const Row& row : rows) {
        INFO("'" << row.address << "'");
        const Result<int> node = numa_node_of_pci(row.address, sysfs.root);
        CHECK((node.ok() ? Errc::ok : node.status().code()) == row.expected);
        if (row.expected == Errc::invalid_argument) {
            CHECK_THAT(std::string(node.status().message()), Catch::Contains("is not a PCI address"));
        }
    }
}

TEST_CASE("numa: mbind binds pages before their first touch; get_mempolicy reads it back", "[numa]") {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* memory = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(memory != MAP_FAILED);
    auto* const second = static_cast<std::byte*>(memory) + page;
    CHECK(numa_policy_node(memory).value() == -1);  // the default policy
    REQUIRE(numa_bind(memory, page, 0).ok());
    CHECK(numa_policy_node(memory).value() == 0);
    CHECK(numa_policy_node(second).value() == -1);  // only the range asked for
    const Status one = numa_bind(second, page, 1);
    if (machine_has_node(1)) {
        CHECK(one.ok());
        CHECK(numa_policy_node(second).value() == 1);
    } else {
        CHECK(one.code() == Errc::invalid_argument);
        CHECK_THAT(std::string(one.message()), Catch::Contains("to node 1 failed"));
        CHECK(numa_policy_node(second).value() == -1);  // unchanged
    }
    CHECK(numa_bind(memory, page, -1).code() == Errc::invalid_argument);
    CHECK(numa_bind(memory, page, max_numa_nodes).code() == Errc::invalid_argument);
    ::munmap(memory, 2 * page);
}

TEST_CASE("numa: a pool with NumaPlacement serves each device from its node's arena", "[numa]") {
    FakeSysfs sysfs;
    numa_reports.clear();
    PciMock host("0000:17:00.0");
    PciMock near0("0000:17:00.0"), near1("0000:65:00.0"), nowhere("0000:b3:00.0"), unknown;
    PinnedHostPool<PciMock> pool(host, {}, NumaPlacement{.enabled = true, .sysfs_root = sysfs.root});
    pool.set_error_sink(&numa_sink);
    CHECK(pool.numa_node(near0) == 0);
    CHECK(pool.numa_node(nowhere) == -1);

    auto on0 = pool.allocate_near(near0, 10000);
    REQUIRE(on0.ok());
    CHECK(numa_policy_node(on0->data()).value() == 0);  // bound before it was touched and pinned
    CHECK(host.calls(MockOp::host_register) == 1);
    CHECK(host.calls(MockOp::pinned_malloc) == 0);
    CHECK(pool.stats().numa_blocks == 1);

    auto plain = pool.allocate(10000);  // allocate(): the backend's pinned memory, unbound
    REQUIRE(plain.ok());
    CHECK(host.calls(MockOp::pinned_malloc) == 1);
    auto far = pool.allocate_near(nowhere, 10000);  // no node known: the same
    REQUIRE(far.ok());
    CHECK(host.calls(MockOp::pinned_malloc) == 2);

    auto on1 = pool.allocate_near(near1, 10000);
    REQUIRE(on1.ok());
    if (machine_has_node(1)) {
        CHECK(numa_policy_node(on1->data()).value() == 1);
        CHECK(numa_reports.empty());
    } else {
        // This machine has no node 1: reported once, then served from pinned_malloc memory.
        CHECK(pool.stats().numa_fallbacks == 1);
        REQUIRE(numa_reports.size() == 1);
        CHECK_THAT(numa_reports[0], Catch::Contains("NUMA node 1 refused") && Catch::Contains("mbind"));
        CHECK(host.calls(MockOp::pinned_malloc) == 3);
        CHECK(pool.numa_node(near1) == -1);
        auto again = pool.allocate_near(near1, 10000);
        REQUIRE(again.ok());
        CHECK(numa_reports.size() == 1);
    }

    // The arenas stay apart in the cache: node 0's block serves node 0 only.
    void* const block0 = on0->data();
    on0->reset();
    auto other = pool.allocate_near(nowhere, 10000);
    REQUIRE(other.ok());
    CHECK(other->data() != block0);
    auto back = pool.allocate_near(near0, 10000);
    REQUIRE(back.ok());
    CHECK(back->data() == block0);
    CHECK(pool.stats().numa_blocks == 1);

    // Explicit configuration, for a backend that cannot say.
    CHECK(pool.numa_node(unknown) == -1);
    CHECK_THAT(numa_reports.back(), Catch::Contains("NUMA node of a device") && Catch::Contains("unknown"));
    REQUIRE(pool.set_numa_node(unknown, 0).ok());
    CHECK(pool.numa_node(unknown) == 0);
    auto raw = pool.allocate_raw_near(unknown, 64);
    REQUIRE(raw.ok());
    CHECK(numa_policy_node(*raw).value() == 0);
    CHECK(pool.set_numa_node(unknown, -2).code() == Errc::invalid_argument);
    CHECK(pool.numa_node(unknown) == 0);  // nothing changed
    REQUIRE(pool.release(*raw).ok());

    back->reset();
    REQUIRE(pool.trim().ok());
    CHECK(host.calls(MockOp::host_unregister) == host.calls(MockOp::host_register));
}

TEST_CASE("numa: without NumaPlacement allocate_near is allocate, and set_numa_node is refused", "[numa]") {
    PciMock host("0000:17:00.0");
    {
        PinnedHostPool<PciMock> pool(host);
        auto buffer = pool.allocate_near(host, 4096);
        REQUIRE(buffer.ok());
        CHECK(host.calls(MockOp::pinned_malloc) == 1);
        CHECK(host.calls(MockOp::host_register) == 0);
        CHECK(pool.numa_node(host) == -1);
        const Status refused = pool.set_numa_node(host, 0);
        CHECK(refused.code() == Errc::invalid_argument);
        CHECK_THAT(std::string(refused.message()), Catch::Contains("without NUMA placement"));
    }
    CHECK(host.live_pinned_allocations() == 0);
}
