// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "devstage/status.hpp"

using devstage::Errc;
using devstage::Result;
using devstage::Status;

TEST_CASE("status: default is ok, an error keeps code and message", "[status]") {
    Status ok;
    CHECK(ok.ok());
    CHECK(static_cast<bool>(ok));
    CHECK(ok.code() == Errc::ok);
    CHECK(ok.message().empty());

    Status error(Errc::out_of_memory, "grow failed: required 12 bytes");
    CHECK_FALSE(error.ok());
    CHECK_FALSE(static_cast<bool>(error));
    CHECK(error.code() == Errc::out_of_memory);
    CHECK(error.message() == "grow failed: required 12 bytes");
    CHECK(devstage::to_string(error.code()) == "out_of_memory");
}

TEST_CASE("status: an ok code makes an ok status", "[status]") {
    Status s(Errc::ok, "ignored");
    CHECK(s.ok());
    CHECK(s.message().empty());
}

TEST_CASE("result: holds a value or an error", "[status]") {
    Result<int> value = 42;
    REQUIRE(value.ok());
    CHECK(*value == 42);
    CHECK(value.value() == 42);
    CHECK(value.status().ok());

    Result<int> error = Status(Errc::invalid_argument, "bad");
    REQUIRE_FALSE(error.ok());
    CHECK_FALSE(static_cast<bool>(error));
    CHECK(error.status().code() == Errc::invalid_argument);
    CHECK(error.status().message() == "bad");
}

TEST_CASE("result: built from an ok status it is still an error", "[status]") {
    Result<int> r = Status();
    CHECK_FALSE(r.ok());
    CHECK(r.status().code() == Errc::backend_failure);
}

TEST_CASE("result: move-only values and operator->", "[status]") {
    Result<std::unique_ptr<std::string>> r = std::make_unique<std::string>("pinned");
    REQUIRE(r.ok());
    CHECK((*r)->size() == 6);
    std::unique_ptr<std::string> taken = std::move(r).value();
    CHECK(*taken == "pinned");
    Result<std::string> s = std::string("abc");
    CHECK(s->size() == 3);
}

TEST_CASE("errc: every code has a distinct name", "[status]") {
    CHECK(devstage::to_string(Errc::busy) == "busy");
    CHECK(devstage::to_string(Errc::unknown_pointer) == "unknown_pointer");
    CHECK(devstage::to_string(Errc::library_not_found) == "library_not_found");
    CHECK(devstage::to_string(Errc::leaked) == "leaked");
}

namespace {
struct Logger {
    std::vector<std::string> lines;
    void operator()(const devstage::Status& status) { lines.push_back(status.message()); }
};
void count_context(void* context, const devstage::Status&) noexcept {
    ++*static_cast<int*>(context);
}
}  // namespace

TEST_CASE("status: an ErrorSink reaches a plain function, a function with context, or a callable object",
          "[status][sink]") {
    using devstage::ErrorSink;
    const devstage::Status failure(devstage::Errc::backend_failure, "cleanup failed");
    Logger logger;
    const ErrorSink to_logger = ErrorSink::to(logger);
    to_logger(failure);
    REQUIRE(logger.lines.size() == 1);
    CHECK(logger.lines[0] == "cleanup failed");
    int count = 0;
    const ErrorSink with_context(&count_context, &count);
    with_context(failure);
    with_context(failure);
    CHECK(count == 2);
    const ErrorSink null_function(static_cast<ErrorSink::Function>(nullptr));  // falls back to stderr
    const ErrorSink null_context(static_cast<ErrorSink::ContextFunction>(nullptr), &count);
    null_context(failure);  // stderr, not a null call
    CHECK(count == 2);
    (void)null_function;
}
