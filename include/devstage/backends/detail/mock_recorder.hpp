// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the ledger of a MockBackend's calls. Every call is counted and, when the journal is
// on, journaled as a MockCall; the calls a test chose fail on purpose (fail_call, fail_from)
// or fail when the work they enqueued runs (fail_when_run); and the misuses the mock detects
// are counted. Not thread-safe: the MockBackend calls it under its mutex.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "devstage/backends/detail/address_map.hpp"
#include "devstage/backends/mock_journal.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class MockRecorder {
public:
    /// `journal`: whether calls are journaled (MockConfig::journal).
    explicit MockRecorder(bool journal) noexcept : journal_on_(journal) {}

    // ---- the calls that fail on purpose -------------------------------------------------
    /// Calls `first` to `last` of `op` (1-based, counted from construction) fail with `code`.
    void fail_calls(MockOp op, std::uint64_t first, std::uint64_t last, Errc code) noexcept {
        faults_[index(op)] = Fault{first, last, code};
    }
    /// Call `k` of `op` succeeds; the work it enqueued fails with `code` when it runs.
    void fail_when_run(MockOp op, std::uint64_t k, Errc code) noexcept { run_faults_[index(op)] = Fault{k, k, code}; }
    void clear_faults() noexcept {
        faults_ = {};
        run_faults_ = {};
    }

    // ---- each call ------------------------------------------------------------------------
    /// Counts the call; returns the injected failure if this call is one.
    Status begin(MockOp op) noexcept {
        const std::uint64_t n = ++calls_[index(op)];
        const Fault& fault = faults_[index(op)];
        if (fault.first != 0 && n >= fault.first && n <= fault.last) {
            return Status(fault.code, message("mock ", to_string(op), ": injected failure of call ", n));
        }
        return {};
    }
    /// Journals the call and how it ended; returns `status`.
    Status finish(MockOp op, const void* pointer, std::size_t bytes, Status status, std::uint32_t stream = 0,
                  std::uint32_t event = 0) noexcept {
        if (journal_on_) {
            // A journal entry the host cannot store is dropped; the call's outcome stands.
            (void)without_bad_alloc([&] {
                journal_.push_back(MockCall{op, pointer, bytes, status.code(), stream, event});
            });
        }
        return status;
    }
    /// The misuse messages kept for misuse_report(): the first ones only.
    static constexpr std::size_t misuse_log_limit = 64;

    /// A misuse detected: counted, its message kept (the first misuse_log_limit), and returned
    /// as the call's failure.
    Status misuse(Errc code, std::string text) noexcept {
        ++misuses_;
        if (misuse_log_.size() < misuse_log_limit) {
            // A message the host cannot store is dropped from the report; the count stands.
            (void)without_bad_alloc([&] { misuse_log_.push_back(text); });
        }
        return Status(code, std::move(text));
    }
    /// What the work enqueued by call `call` of `op` on `stream` reports when it runs: the
    /// failure fail_when_run chose, or ok.
    Status failure_when_run(MockOp op, std::uint64_t call, std::uint32_t stream) const noexcept {
        const Fault& fault = run_faults_[index(op)];
        if (fault.first != 0 && call >= fault.first && call <= fault.last) {
            return Status(fault.code, message("mock ", to_string(op), ": injected failure of call ", call,
                                              " when it ran on stream ", stream));
        }
        return {};
    }

    // ---- observation ----------------------------------------------------------------------
    /// Calls of `op` so far, failed ones included.
    std::uint64_t calls(MockOp op) const noexcept { return calls_[index(op)]; }
    std::uint64_t total_calls() const noexcept {
        std::uint64_t total = 0;
        for (std::uint64_t n : calls_) total += n;
        return total;
    }
    const std::vector<MockCall>& journal() const noexcept { return journal_; }
    void clear_journal() noexcept { journal_.clear(); }
    std::uint64_t misuses() const noexcept { return misuses_; }
    const std::vector<std::string>& misuse_log() const noexcept { return misuse_log_; }

private:
    struct Fault {
        std::uint64_t first = 0, last = 0;  // 0: none
        Errc code = Errc::backend_failure;
    };

    static constexpr std::size_t index(MockOp op) noexcept { return static_cast<std::size_t>(op); }

    bool journal_on_;
    std::array<std::uint64_t, mock_op_count> calls_{};
    std::array<Fault, mock_op_count> faults_{};
    std::array<Fault, mock_op_count> run_faults_{};
    std::vector<MockCall> journal_;
    std::uint64_t misuses_ = 0;
    std::vector<std::string> misuse_log_;
};

}  // namespace devstage::detail
