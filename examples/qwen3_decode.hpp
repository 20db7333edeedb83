// SPDX-License-Identifier: Apache-2.0
#pragma once
// A Qwen3-14B-decode-shaped input set: 19 tensors with the model's real dimensions (40 layers,
// hidden 5120, 40 query / 8 KV heads of 128, MLP 17408, paged KV cache of 128-token blocks,
// batch 16, context 4096), stacked over layers as an engine stages them. The table is defined
// once; one generator fills it into whatever storage it is given — pageable host memory or a
// PinnedHostPool — writing each value straight into its final place.
//
//   devstage::PinnedHostPool<devstage::SimBackend> pool(sim);
//   qwen3::PinnedStorage storage(pool);
//   qwen3::Inputs inputs = qwen3::generate(storage, 0.002);  // inputs.args → Stager::bind

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "devstage/pinned.hpp"
#include "devstage/status.hpp"
#include "devstage/tensor.hpp"

namespace qwen3 {

using devstage::Direction;

struct Dims {
    std::size_t layers = 40, hidden = 5120, heads = 40, kv_heads = 8, head_dim = 128, intermediate = 17408;
    std::size_t batch = 16, context = 4096, block_size = 128;
    std::size_t blocks_per_sequence() const { return context / block_size; }
    std::size_t kv_blocks() const { return batch * blocks_per_sequence(); }
};

enum class Fill : std::uint8_t {
    weights,
    ones,
    activations,
    rope_cos,
    rope_sin,
    zeros,
    block_table,
    slot_mapping,
    seq_lens
};

/// One tensor: rows × cols elements. `scaled` rows shrink with the scale factor (layers, KV
/// blocks, RoPE positions); batch-sized tensors keep their shape.
struct TensorSpec {
    std::string_view name;
    std::size_t rows, cols, element_bytes;
    Direction direction;
    Fill fill;
    bool scaled;

    std::size_t rows_at(double scale) const {
        if (!scaled) return rows;
        const auto r = static_cast<std::size_t>(std::ceil(static_cast<double>(rows) * scale));
        return r == 0 ? 1 : r;
    }
    std::size_t bytes_at(double scale) const { return rows_at(scale) * cols * element_bytes; }
};

inline constexpr std::size_t tensor_count = 19;

/// The table: the only place the input set is described.
inline std::array<TensorSpec, tensor_count> table(const Dims& d = {}) {
    const std::size_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim, L = d.layers;
    return {{
        {"hidden_states", d.batch, d.hidden, 2, Direction::In, Fill::activations, false},
        {"input_layernorm", L, d.hidden, 2, Direction::In, Fill::ones, true},
        {"q_proj", L * d.hidden, q, 2, Direction::In, Fill::weights, true},
        {"k_proj", L * d.hidden, kv, 2, Direction::In, Fill::weights, true},
        {"v_proj", L * d.hidden, kv, 2, Direction::In, Fill::weights, true},
        {"o_proj", L * q, d.hidden, 2, Direction::In, Fill::weights, true},
        {"qk_norm", L * 2, d.head_dim, 2, Direction::In, Fill::ones, true},
        {"post_attention_layernorm", L, d.hidden, 2, Direction::In, Fill::ones, true},
        {"gate_proj", L * d.hidden, d.intermediate, 2, Direction::In, Fill::weights, true},
        {"up_proj", L * d.hidden, d.intermediate, 2, Direction::In, Fill::weights, true},
        {"down_proj", L * d.intermediate, d.hidden, 2, Direction::In, Fill::weights, true},
        {"rope_cos", d.context, d.head_dim, 4, Direction::In, Fill::rope_cos, true},
        {"rope_sin", d.context, d.head_dim, 4, Direction::In, Fill::rope_sin, true},
        {"key_cache", L * d.kv_blocks() * d.block_size, kv, 2, Direction::InOut, Fill::zeros, true},
        {"value_cache", L * d.kv_blocks() * d.block_size, kv, 2, Direction::InOut, Fill::zeros, true},
        {"block_table", d.batch, d.blocks_per_sequence(), 4, Direction::In, Fill::block_table, false},
        {"slot_mapping", d.batch, 1, 8, Direction::In, Fill::slot_mapping, false},
        {"seq_lens", d.batch, 1, 4, Direction::In, Fill::seq_lens, false},
        {"output", d.batch, d.hidden, 2, Direction::Out, Fill::zeros, false},
    }};
}

/// Storage policy: plain pageable host memory.
class PageableStorage {
public:
    std::span<std::byte> allocate(std::size_t bytes) {
        blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes));
        return {blocks_.back().get(), bytes};
    }

private:
    std::vector<std::unique_ptr<std::byte[]>> blocks_;
};

/// Storage policy: page-locked memory from a PinnedHostPool (any backend).
class PinnedStorage {
public:
    template <class Pool>
    explicit PinnedStorage(Pool& pool) : allocate_([&pool](std::size_t n) { return pool.allocate(n); }) {}

    /// An empty span when the pool refuses; `status()` says why.
    std::span<std::byte> allocate(std::size_t bytes) {
        devstage::Result<devstage::PinnedBuffer> buffer = allocate_(bytes);
        if (!buffer) {
            status_ = buffer.status();
            return {};
        }
        buffers_.push_back(std::move(*buffer));
        return {static_cast<std::byte*>(buffers_.back().data()), bytes};
    }
    const devstage::Status& status() const { return status_; }

private:
    std::function<devstage::Result<devstage::PinnedBuffer>(std::size_t)> allocate_;
    std::vector<devstage::PinnedBuffer> buffers_;
    devstage::Status status_;
};

struct Inputs {
    std::vector<devstage::TensorArg> args;  ///< in table order, ready for Stager::bind
    std::vector<std::string_view> names;
    std::size_t total_bytes = 0;
    bool ok() const { return args.size() == tensor_count; }
};

namespace detail {
inline std::uint16_t to_bf16(float value) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // round to nearest even
}

// Writes one tensor in place. Values are deterministic in (seed, tensor index, element).
inline void fill(const TensorSpec& spec, std::span<std::byte> out, const Dims& d, std::size_t rows,
                 std::uint32_t seed) {
    const std::size_t elements = rows * spec.cols;
    std::uint64_t state = 0x9E3779B97F4A7C15ull ^ seed;
    const auto next = [&state] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state;
    };
    auto* bf16 = reinterpret_cast<std::uint16_t*>(out.data());
    auto* f32 = reinterpret_cast<float*>(out.data());
    auto* i32 = reinterpret_cast<std::int32_t*>(out.data());
    auto* i64 = reinterpret_cast<std::int64_t*>(out.data());
    switch (spec.fill) {
        case Fill::weights:  // ~N(0, 0.02): the sum of four uniforms, centred and scaled
        case Fill::activations:
            for (std::size_t i = 0; i < elements; ++i) {
                const std::uint64_t r = next();
                const float u =
                    static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48)) /
                        65536.0f -
                    2.0f;
                bf16[i] = to_bf16(u * (spec.fill == Fill::weights ? 0.035f : 1.0f));
            }
            break;
        case Fill::ones:
            for (std::size_t i = 0; i < elements; ++i) bf16[i] = to_bf16(1.0f);
            break;
        case Fill::rope_cos:
        case Fill::rope_sin:
            for (std::size_t p = 0; p < rows; ++p) {
                for (std::size_t j = 0; j < spec.cols; ++j) {
                    const double inv_freq =
                        std::pow(1000000.0, -static_cast<double>(2 * (j / 2)) / static_cast<double>(spec.cols));
                    const double angle = static_cast<double>(p) * inv_freq;
                    f32[p * spec.cols + j] =
                        static_cast<float>(spec.fill == Fill::rope_cos ? std::cos(angle) : std::sin(angle));
                }
            }
            break;
        case Fill::zeros:
            std::memset(out.data(), 0, out.size());
            break;
        case Fill::block_table:
            for (std::size_t b = 0; b < rows; ++b) {
                for (std::size_t j = 0; j < spec.cols; ++j)
                    i32[b * spec.cols + j] = static_cast<std::int32_t>(b * spec.cols + j);
            }
            break;
        case Fill::slot_mapping:
            for (std::size_t b = 0; b < rows; ++b) {
                const std::size_t position = (next() % (d.context - 1));
                i64[b] = static_cast<std::int64_t>(b * d.blocks_per_sequence() * d.block_size + position);
            }
            break;
        case Fill::seq_lens:
            for (std::size_t b = 0; b < rows; ++b) i32[b] = static_cast<std::int32_t>(1 + next() % (d.context - 1));
            break;
    }
}
}  // namespace detail

/// Allocates every tensor of the table from `storage` and fills it in place.
/// Returns inputs with `ok() == false` when the storage refused an allocation.
template <class Storage>
Inputs generate(Storage& storage, double scale, std::uint32_t seed = 1234, const Dims& dims = {}) {
    Inputs inputs;
    const auto specs = table(dims);
    for (std::size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& spec = specs[i];
        const std::size_t bytes = spec.bytes_at(scale);
        std::span<std::byte> memory = storage.allocate(bytes);
        if (memory.size() != bytes) {
            inputs.args.clear();
            return inputs;
        }
        detail::fill(spec, memory, dims, spec.rows_at(scale), seed + static_cast<std::uint32_t>(i));
        inputs.args.push_back(devstage::TensorArg{memory.data(), bytes, spec.direction});
        inputs.names.push_back(spec.name);
        inputs.total_bytes += bytes;
    }
    return inputs;
}

}  // namespace qwen3
