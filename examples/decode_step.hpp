// SPDX-License-Identifier: Apache-2.0
#pragma once
// One decode step of the Qwen3-14B-shaped model of qwen3_decode.hpp, as an engine passes it: 19
// args, of which the 14 weight, RoPE and KV-cache tensors live on the device and 5 are the
// step's own (tokens, positions, block table and temperatures in; logits out). Also the two
// things the example needs around it:
//   - Batch, the engine's side: 16 sequences, their scripted tokens, and the KV-cache blocks
//     each is given as it grows (the paged cache's block table);
//   - step(), a stand-in for the model's arithmetic, small but reading every tensor that
//     carries state from step to step. It is written once and run twice: by the kernel
//     stand-in on the device's copies of the tensors, and by the host reference on the host's,
//     so a byte moved wrong anywhere changes a logit.
//
//   decode::Batch batch(cache_blocks, steps);
//   batch.fill(step, inputs);                   // the step's tokens, positions, block table
//   decode::step(decode::view(run.device_args()));  // what the kernel computes

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "devstage/tensor.hpp"
#include "qwen3_decode.hpp"

namespace decode {

inline constexpr std::size_t batch = 16;                // qwen3::Dims::batch
inline constexpr std::size_t block_size = 128;          // tokens per KV-cache block
inline constexpr std::size_t blocks_per_sequence = 32;  // a context of 4096 tokens
inline constexpr std::size_t kv_width = 1024;           // 8 KV heads of 128
inline constexpr std::size_t hidden = 5120;
inline constexpr std::size_t vocab = 151936;  // Qwen3's vocabulary

/// The args of a step, in the order they are bound: the step's inputs, the 14 tensors that
/// stay on the device (qwen3::table() rows 1-14, input_layernorm to value_cache), the logits.
enum Arg : std::size_t { tokens, positions, block_table, temperatures, first_resident, logits = first_resident + 14 };
inline constexpr std::size_t arg_count = logits + 1;
inline constexpr std::size_t resident_count = logits - first_resident;

/// The arg of qwen3::table() row `row` (1-14).
constexpr std::size_t resident_arg(std::size_t row) noexcept {
    return first_resident + row - 1;
}
inline constexpr std::size_t k_proj = resident_arg(3), v_proj = resident_arg(4), o_proj = resident_arg(5);
inline constexpr std::size_t key_cache = resident_arg(13), value_cache = resident_arg(14);

/// The bytes of each of the step's own args.
inline constexpr std::array<std::size_t, 4> input_bytes{batch * 4, batch * 4, batch* blocks_per_sequence * 4,
                                                        batch * 4};
inline constexpr std::size_t logits_bytes = batch * vocab * sizeof(float);

/// The KV-cache blocks the scaled cache tensor holds: the stand-in keeps one layer's keys
/// and values, 128 rows of 1024 bf16 values per block.
inline std::size_t cache_blocks(double scale) {
    return qwen3::table()[13].rows_at(scale) / block_size;
}

/// The step's tensors as the arithmetic reads and writes them, through pointers the host can
/// dereference: the simulator's device memory, or host copies.
struct View {
    const std::int32_t* tokens;
    const std::int32_t* positions;
    const std::int32_t* block_table;
    const float* temperatures;
    const std::uint16_t *k_proj, *v_proj, *o_proj;  // bf16 rows of kv_width, kv_width, hidden
    std::size_t k_rows, v_rows, o_rows;
    std::uint16_t *key_cache, *value_cache;  // bf16 rows of kv_width
    std::size_t cache_rows;
    float* logits;  // batch rows of vocab
};

/// The view of args laid out as Arg says (a run's device_args(), or host copies).
inline View view(std::span<const devstage::TensorArg> args) {
    const auto at = [&](std::size_t i) { return args[i].data; };
    const auto rows = [&](std::size_t i, std::size_t width) { return args[i].bytes / (width * 2); };
    return View{static_cast<const std::int32_t*>(at(tokens)),
                static_cast<const std::int32_t*>(at(positions)),
                static_cast<const std::int32_t*>(at(block_table)),
                static_cast<const float*>(at(temperatures)),
                static_cast<const std::uint16_t*>(at(k_proj)),
                static_cast<const std::uint16_t*>(at(v_proj)),
                static_cast<const std::uint16_t*>(at(o_proj)),
                rows(k_proj, kv_width),
                rows(v_proj, kv_width),
                rows(o_proj, hidden),
                static_cast<std::uint16_t*>(at(key_cache)),
                static_cast<std::uint16_t*>(at(value_cache)),
                std::min(rows(key_cache, kv_width), rows(value_cache, kv_width)),
                static_cast<float*>(at(logits))};
}

inline float from_bf16(std::uint16_t bits) {
    const std::uint32_t word = std::uint32_t{bits} << 16;
    float value;
    std::memcpy(&value, &word, sizeof value);
    return value;
}

/// Writes the key and value rows of token `token` at `position` into cache row `row`: the
/// token's rows of k_proj (rotated by the position, RoPE's stand-in) and of v_proj.
inline void write_kv(const View& v, std::int32_t token, std::int32_t position, std::size_t row) {
    const std::size_t t = static_cast<std::size_t>(token);
    const std::size_t shift = static_cast<std::size_t>(position) % kv_width;
    const std::uint16_t* k = v.k_proj + (t % v.k_rows) * kv_width;
    std::uint16_t* key = v.key_cache + row * kv_width;
    std::memcpy(key, k + shift, (kv_width - shift) * 2);
    std::memcpy(key + (kv_width - shift), k, shift * 2);
    std::memcpy(v.value_cache + row * kv_width, v.v_proj + (t % v.v_rows) * kv_width, kv_width * 2);
}

/// The step: for each sequence, writes the key and value of its token at its position into
/// the cache, attends from that key over every cached position of the sequence, and writes
/// logits = (attention output + the token's o_proj row, tiled over the vocabulary) /
/// temperature. False, having written nothing more, when an input lies outside its range (a
/// token, a position, a block the cache does not hold, a temperature that is not positive):
/// inputs an engine never sends, so bytes that arrived wrong.
inline bool step(const View& v) {
    if (v.k_rows == 0 || v.v_rows == 0 || v.o_rows == 0) return false;
    std::array<float, kv_width> query{}, context{};
    std::array<float, hidden> bias{};
    for (std::size_t b = 0; b < batch; ++b) {
        const std::int32_t token = v.tokens[b], position = v.positions[b];
        const float temperature = v.temperatures[b];
        if (token < 0 || static_cast<std::size_t>(token) >= vocab || position < 0 ||
            static_cast<std::size_t>(position) >= blocks_per_sequence * block_size || !(temperature > 0) ||
            !std::isfinite(temperature)) {
            return false;
        }
        const std::int32_t* table = v.block_table + b * blocks_per_sequence;
        for (std::size_t i = 0; i <= static_cast<std::size_t>(position) / block_size; ++i) {
            if (table[i] < 0 || (static_cast<std::size_t>(table[i]) + 1) * block_size > v.cache_rows) return false;
        }
        const auto row_of = [&](std::size_t p) {
            return static_cast<std::size_t>(table[p / block_size]) * block_size + p % block_size;
        };
        write_kv(v, token, position, row_of(static_cast<std::size_t>(position)));

        const std::uint16_t* key = v.key_cache + row_of(static_cast<std::size_t>(position)) * kv_width;
        for (std::size_t j = 0; j < kv_width; ++j) query[j] = from_bf16(key[j]);
        context.fill(0.0f);
        for (std::size_t p = 0; p <= static_cast<std::size_t>(position); ++p) {
            const std::uint16_t* k = v.key_cache + row_of(p) * kv_width;
            const std::uint16_t* value = v.value_cache + row_of(p) * kv_width;
            float score = 0;
            for (std::size_t j = 0; j < kv_width; ++j) score += from_bf16(k[j]) * query[j];
            score *= 0.03125f;  // 1 / sqrt(kv_width)
            for (std::size_t j = 0; j < kv_width; ++j) context[j] += score * from_bf16(value[j]);
        }
        const float mean = 1.0f / static_cast<float>(position + 1);
        for (float& c : context) c *= mean;

        const std::uint16_t* o = v.o_proj + (static_cast<std::size_t>(token) % v.o_rows) * hidden;
        for (std::size_t i = 0; i < hidden; ++i) bias[i] = from_bf16(o[i]);
        const float inverse = 1.0f / temperature;
        float* out = v.logits + b * vocab;
        for (std::size_t base = 0; base < vocab; base += hidden) {
            const std::size_t n = std::min(hidden, vocab - base);
            for (std::size_t i = 0; i < n; ++i) out[base + i] = (context[i % kv_width] + bias[i]) * inverse;
        }
    }
    return true;
}

/// The engine's side of the batch: 16 sequences with prompts of 8 to 125 tokens, one token
/// decoded per step. A sequence is given a KV-cache block when it enters one (its prompt's at
/// the start), from the end of the cache down, so the block table is no identity.
class Batch {
public:
    /// Precondition: fits(cache_blocks, steps) is empty.
    Batch(std::size_t cache_blocks, int steps) {
        std::size_t next = cache_blocks;
        for (std::size_t b = 0; b < batch; ++b) {
            blocks_[b].fill(-1);
            for (std::size_t i = 0; i * block_size < prompt_length(b); ++i)
                blocks_[b][i] = static_cast<std::int32_t>(--next);
        }
        for (int s = 0; s < steps; ++s) {
            for (std::size_t b = 0; b < batch; ++b) {
                const std::size_t p = position(b, s);
                if (p % block_size == 0) blocks_[b][p / block_size] = static_cast<std::int32_t>(--next);
            }
        }
    }

    /// Empty when a cache of `cache_blocks` blocks holds the batch over `steps` steps, else why
    /// not.
    static std::string fits(std::size_t cache_blocks, int steps) {
        std::size_t needed = 0, longest = 0;
        for (std::size_t b = 0; b < batch; ++b) {
            const std::size_t length = prompt_length(b) + static_cast<std::size_t>(steps);
            longest = std::max(longest, length);
            needed += (length + block_size - 1) / block_size;
        }
        const std::size_t context = blocks_per_sequence * block_size;
        if (longest > context) {
            return "a sequence would outgrow the context of " + std::to_string(context) + " tokens at " +
                   std::to_string(steps) + " steps (at most " + std::to_string(steps - (longest - context)) + ")";
        }
        if (needed <= cache_blocks) return {};
        return "the KV cache holds " + std::to_string(cache_blocks) + " blocks of " + std::to_string(block_size) +
               " tokens, and " + std::to_string(steps) + " steps need " + std::to_string(needed) +
               ": a larger --scale or fewer --steps";
    }

    static std::size_t prompt_length(std::size_t b) { return 1 + (b * 53 + 17) % 127; }
    static std::size_t position(std::size_t b, int step) { return prompt_length(b) + static_cast<std::size_t>(step); }

    /// The scripted token at a position of a sequence: its prompt, then what it "samples".
    static std::int32_t token(std::size_t b, std::size_t position) {
        std::uint64_t x = (b << 32) ^ position ^ 0x9E3779B97F4A7C15ull;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        return static_cast<std::int32_t>((x ^ (x >> 31)) % vocab);
    }
    static float temperature(std::size_t b) { return 0.5f + 0.125f * static_cast<float>(b % 8); }

    /// Writes step `step`'s inputs, laid out as Arg says, into `args[tokens..temperatures]`.
    void fill(int step, std::span<const devstage::TensorArg> args) const {
        auto* t = static_cast<std::int32_t*>(args[tokens].data);
        auto* p = static_cast<std::int32_t*>(args[positions].data);
        auto* table = static_cast<std::int32_t*>(args[block_table].data);
        auto* temperature_of = static_cast<float*>(args[temperatures].data);
        for (std::size_t b = 0; b < batch; ++b) {
            const std::size_t at = position(b, step);
            t[b] = token(b, at);
            p[b] = static_cast<std::int32_t>(at);
            temperature_of[b] = temperature(b);
            for (std::size_t i = 0; i < blocks_per_sequence; ++i)
                table[b * blocks_per_sequence + i] = i <= at / block_size ? blocks_[b][i] : -1;
        }
    }

    /// Writes the prompts' keys and values into the cache of `v` (the prefill).
    void prefill(const View& v) const {
        for (std::size_t b = 0; b < batch; ++b) {
            for (std::size_t p = 0; p < prompt_length(b); ++p) {
                const auto row = static_cast<std::size_t>(blocks_[b][p / block_size]) * block_size + p % block_size;
                write_kv(v, token(b, p), static_cast<std::int32_t>(p), row);
            }
        }
    }

    /// KV rows the prompts and `steps` steps write.
    static std::size_t rows_written(int steps) {
        std::size_t rows = 0;
        for (std::size_t b = 0; b < batch; ++b) rows += prompt_length(b) + static_cast<std::size_t>(steps);
        return rows;
    }

private:
    std::array<std::array<std::int32_t, blocks_per_sequence>, batch> blocks_{};
};

}  // namespace decode
