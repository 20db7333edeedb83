// SPDX-License-Identifier: Apache-2.0
#pragma once
// The steps of a random engine program: what each arg points at, how a step binds, kernels and
// finishes, how the engine ends with a Completion, and a trace line.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "devstage/tensor.hpp"

namespace sequential {

using devstage::Direction;
using devstage::HostMemory;

/// What an arg points at: a host buffer, a caller-owned device buffer, or a tensor of a frame.
enum class Where : std::uint8_t { host, device, frame };

struct ArgSpec {
    Where where = Where::host;
    int index = 0;   // the buffer, or the frame's step
    int tensor = 0;  // a frame's tensor
    std::size_t offset = 0;
    std::size_t bytes = 0;
    Direction direction = Direction::InOut;
    HostMemory memory = HostMemory::unknown;
};

/// Where a frame's input tensor is filled from: a pattern, or a host buffer or another frame's
/// tensor the engine owns (nothing in flight writes it).
struct FillSpec {
    bool from_source = false;
    Where where = Where::host;
    int index = 0;
    int tensor = 0;
};

struct StepSpec {
    bool frame = false;
    bool bind_object = false;   // bind(*frame, stream) rather than bind(frame->args(), stream)
    std::vector<ArgSpec> args;  // for a frame: its shapes (where = frame, index = the step itself)
    std::vector<FillSpec> fills;
    unsigned bind_stream = 0;
    unsigned finish_stream = 0;
    // The kernel on the finish stream, after waiting for the bind stream (odd steps through
    // Stager::order_after_uploads, even ones with the engine's own event).
    bool kernel_on_finish = false;
    bool partial = false;  // the kernel leaves some output bytes unwritten
    /// bind_slot on this slot (a plain step; it may be out of range) rather than bind.
    std::optional<std::size_t> slot;
    /// bind(args) and finish(run): synchronous, the kernel waited for by the engine before the
    /// finish (a plain step).
    bool synchronous = false;
};

/// How the engine ends with a Completion.
enum class End : std::uint8_t { wait, poll, destroy, detach };

/// One line of a trace: `log() << "s" << id << " kernel\n";` appends when the statement ends.
class Line {
public:
    explicit Line(std::string& into) noexcept : into_(into) {}
    Line(const Line&) = delete;
    Line& operator=(const Line&) = delete;
    ~Line() { into_ += out_.str(); }
    template <class T>
    Line& operator<<(const T& value) {
        out_ << value;
        return *this;
    }

private:
    std::string& into_;
    std::ostringstream out_;
};

}  // namespace sequential
