// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: random sequences of bind / finish / drop / release / abandon with random
// arg lists and random fault injection on MockBackend, for each strategy. After every step:
// no live device allocation that no lease or retained slot accounts for, host outputs equal a
// plain reference model, every error a non-ok Status with a message; at the end the stager
// still runs a clean run.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "devstage/backends/mock.hpp"
#include "devstage/devstage.hpp"
#include "fuzz_support.hpp"

namespace {
using namespace devstage;

class Input {
public:
    Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
    bool empty() const { return at_ >= size_; }
    std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
    std::size_t bytes_of(std::size_t n) {
        std::size_t v = 0;
        for (std::size_t i = 0; i < n; ++i) v = v << 8 | byte();
        return v;
    }

private:
    const std::uint8_t* data_;
    std::size_t size_;
    std::size_t at_ = 0;
};

template <class Strategy>
struct Harness {
    MockBackend mock{MockConfig{.sink = &fuzz::quiet}};
    std::optional<Stager<MockBackend, Strategy>> stager;
    std::vector<std::vector<std::byte>> host;
    std::vector<std::vector<std::byte>> expected;  // the reference model of host memory
    std::vector<TensorArg> args;
    std::vector<void*> external;  // caller-owned device memory for Placement::Device args
    std::optional<StagedRun> run;
    std::size_t abandoned = 0;  // allocations forgotten on purpose (a device reset)

    Harness() {
        stager.emplace(mock);
        stager->set_error_sink(&fuzz::quiet);
    }
    ~Harness() {
        run.reset();
        stager.reset();
        for (void* p : external) (void)mock.device_free(p);
    }

    void make_args(Input& in) {
        args.clear();
        host.clear();
        expected.clear();
        const std::size_t count = in.byte() % 9;
        static constexpr std::size_t sizes[] = {0, 1, 63, 64, 1023, 1024, 1025, 4096, 70000};
        for (std::size_t i = 0; i < count; ++i) {
            const std::uint8_t shape = in.byte();
            const std::size_t bytes = sizes[shape % 9] + (shape >> 7) * in.byte();
            const auto direction = static_cast<Direction>(in.byte() % 3);
            host.emplace_back(bytes, static_cast<std::byte>(in.byte()));
            expected.push_back(host.back());
            TensorArg arg{host.back().empty() ? nullptr : host.back().data(), bytes, direction};
            const std::uint8_t kind = in.byte() % 16;
            if (kind == 0 && bytes > 0) arg.data = nullptr;  // invalid: null host pointer with bytes
            if (kind == 1 && bytes > 0) {
                auto device = mock.device_malloc(bytes);
                if (device) {
                    external.push_back(*device);
                    arg = TensorArg{*device, bytes, direction, Placement::Device};
                }
            }
            args.push_back(arg);
        }
    }

    bool any_null() const {
        for (const auto& a : args) {
            if (a.placement == Placement::Host && a.bytes > 0 && a.data == nullptr) return true;
        }
        return false;
    }

    void check_accounting() {
        std::size_t free_leases = 0;
        if (run && run->live()) {
            for (const TensorLease& lease : run->leases()) free_leases += lease.release_kind == ReleaseKind::Free;
        }
        const std::size_t retained = stager->strategy().capacity() > 0 ? 1 : 0;
        EXPECT(mock.live_device_allocations() <=
               external.size() + free_leases + retained + abandoned + refused_frees());
        EXPECT(mock.misuses() == 0);
    }

    void step(Input& in) {
        const std::uint8_t op = in.byte() % 8;
        Status outcome;
        switch (op) {
            case 0:
            case 1: {  // bind
                if (run && run->live()) {
                    std::byte other[16]{};
                    const TensorArg more[] = {{other, sizeof other, Direction::In}};
                    auto second = stager->bind(more);
                    EXPECT(!second.ok() && second.status().code() == Errc::busy);
                    outcome = second.status();
                    break;
                }
                make_args(in);
                auto bound = stager->bind(args);
                if (bound) {
                    EXPECT(!any_null());
                    run.emplace(std::move(*bound));
                } else {
                    outcome = bound.status();
                }
                break;
            }
            case 2: {  // execute and finish
                if (!(run && run->live())) {
                    if (run) {
                        outcome = stager->finish(std::move(*run));
                        EXPECT(outcome.code() == Errc::invalid_argument);
                    }
                    break;
                }
                const auto value = static_cast<int>(in.byte());
                const bool execution_ok = in.byte() % 4 != 0;
                Status executed = execution_ok ? Status() : Status(Errc::backend_failure, "kernel failed");
                const auto device = run->device_args();
                for (std::size_t i = 0; i < args.size() && executed.ok(); ++i) {
                    if (args[i].placement != Placement::Host || args[i].bytes == 0 ||
                        args[i].direction == Direction::In)
                        continue;
                    executed = mock.device_memset(device[i].data, value, args[i].bytes);
                }
                outcome = stager->finish(std::move(*run), executed);
                if (executed.ok() && outcome.ok()) {
                    for (std::size_t i = 0; i < args.size(); ++i) {
                        if (args[i].placement == Placement::Host && args[i].direction != Direction::In &&
                            !expected[i].empty()) {
                            std::memset(expected[i].data(), value, expected[i].size());
                        }
                    }
                    EXPECT(host == expected);
                } else if (!executed.ok()) {
                    EXPECT(host == expected);  // nothing copied back after a failed execution
                } else {
                    // A copy-back failed: each output holds its old bytes or the kernel's, and
                    // inputs are untouched.
                    for (std::size_t i = 0; i < args.size(); ++i) {
                        if (args[i].placement != Placement::Host || args[i].direction == Direction::In) {
                            EXPECT(host[i] == expected[i]);
                            continue;
                        }
                        std::vector<std::byte> written(expected[i].size(), static_cast<std::byte>(value));
                        EXPECT(host[i] == expected[i] || host[i] == written);
                    }
                    expected = host;
                }
                break;
            }
            case 3:  // drop the run without finish
                run.reset();
                for (std::size_t i = 0; i < host.size(); ++i) EXPECT(host[i] == expected[i]);
                break;
            case 4:
                outcome = stager->release();
                EXPECT(stager->strategy().capacity() == 0 || !outcome.ok());
                break;
            case 5: {  // abandon: what the stager held is forgotten, as after a device reset
                std::size_t held = stager->strategy().capacity() > 0 ? 1 : 0;
                if (run && run->live()) {
                    for (const TensorLease& lease : run->leases()) held += lease.release_kind == ReleaseKind::Free;
                }
                stager->abandon();
                abandoned += held;
                break;
            }
            case 6: {  // arm a fault on one of the next calls of an operation
                const auto faulty = static_cast<MockOp>(in.byte() % 4);
                mock.fail_call(faulty, mock.calls(faulty) + 1 + in.byte() % 4,
                               in.byte() % 2 ? Errc::out_of_memory : Errc::backend_failure);
                break;
            }
            default:
                mock.clear_faults();
                break;
        }
        if (!outcome.ok()) EXPECT(!outcome.message().empty());
        check_accounting();
    }

    // Allocations the mock kept because an injected device_free refused them.
    std::size_t refused_frees() const {
        std::size_t n = 0;
        for (const MockCall& call : mock.journal()) n += call.op == MockOp::device_free && call.result != Errc::ok;
        return n;
    }

    void finish_clean() {
        run.reset();
        mock.clear_faults();
        std::vector<std::byte> a(3000, std::byte{1}), b(100);
        const TensorArg clean[] = {{a.data(), a.size(), Direction::In}, {b.data(), b.size(), Direction::Out}};
        auto last = stager->bind(clean);
        EXPECT(last.ok());
        EXPECT(mock.device_memset(last->device_args()[1].data, 7, 100).ok());
        EXPECT(stager->finish(std::move(*last)).ok());
        EXPECT(b == std::vector<std::byte>(100, std::byte{7}));
    }
};

template <class Strategy>
void drive(const std::uint8_t* data, std::size_t size) {
    Harness<Strategy> harness;
    Input in(data, size);
    for (int steps = 0; !in.empty() && steps < 64; ++steps) harness.step(in);
    harness.finish_clean();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    if (data[0] % 2 == 0) {
        drive<RetainedBump<>>(data + 1, size - 1);
    } else {
        drive<PerTensorMalloc<>>(data + 1, size - 1);
    }
    return 0;
}
