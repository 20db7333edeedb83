// SPDX-License-Identifier: Apache-2.0
#pragma once
// A message channel between two processes of one machine over a TCP socket on the loopback
// interface: each message is a 4-byte length and its bytes. The remote-inputs example sends its
// worker address, remote keys and step requests through it; the data itself moves over UCX.
// A receive can keep calling a progress function while it waits (a UCX target must progress
// its worker for puts emulated over TCP to land).

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "devstage/status.hpp"

namespace loopback {

using devstage::Errc;
using devstage::Result;
using devstage::Status;

inline Status system_error(const char* call) {
    return Status(Errc::backend_failure, std::string("loopback channel: ") + call + ": " + std::strerror(errno));
}

class Channel {
public:
    /// A listening socket on 127.0.0.1 at a port the kernel chooses (see port()).
    static Result<Channel> listen() {
        Channel channel(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (channel.fd_ < 0) return system_error("socket");
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(channel.fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
            return system_error("bind");
        if (::listen(channel.fd_, 1) != 0) return system_error("listen");
        socklen_t size = sizeof address;
        if (::getsockname(channel.fd_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
            return system_error("getsockname");
        }
        channel.port_ = ntohs(address.sin_port);
        return channel;
    }

    /// The connection a peer made to this listening channel (which is closed then).
    Result<Channel> accept() {
        const int connected = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (connected < 0) return system_error("accept");
        Channel channel(connected);
        channel.no_delay();
        return channel;
    }

    static Result<Channel> connect(std::uint16_t port) {
        Channel channel(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (channel.fd_ < 0) return system_error("socket");
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = htons(port);
        if (::connect(channel.fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
            return system_error("connect");
        }
        channel.no_delay();
        return channel;
    }

    Channel(Channel&& other) noexcept : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}
    Channel& operator=(Channel&& other) noexcept {
        if (this != &other) {
            close();
            fd_ = std::exchange(other.fd_, -1);
            port_ = other.port_;
        }
        return *this;
    }
    Channel(const Channel&) = delete;
    Channel& operator=(const Channel&) = delete;
    ~Channel() { close(); }

    std::uint16_t port() const noexcept { return port_; }

    Status send(std::span<const std::byte> message) {
        const auto length = static_cast<std::uint32_t>(message.size());
        std::byte header[sizeof length];
        std::memcpy(header, &length, sizeof length);
        if (Status sent = write_all(header); !sent) return sent;
        return write_all(message);
    }

    /// The next message; `progress` is called while none has arrived. A peer that closed the
    /// connection is an error.
    Result<std::vector<std::byte>> receive(const std::function<void()>& progress = {}) {
        std::byte header[sizeof(std::uint32_t)];
        if (Status got = read_all(header, progress); !got) return got;
        std::uint32_t length = 0;
        std::memcpy(&length, header, sizeof length);
        std::vector<std::byte> message(length);
        if (Status got = read_all(message, progress); !got) return got;
        return message;
    }

private:
    explicit Channel(int fd) noexcept : fd_(fd) {}

    void close() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    void no_delay() noexcept {
        const int on = 1;
        (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }

    Status write_all(std::span<const std::byte> bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return system_error("send");
            bytes = bytes.subspan(static_cast<std::size_t>(n));
        }
        return {};
    }

    Status read_all(std::span<std::byte> bytes, const std::function<void()>& progress) {
        while (!bytes.empty()) {
            if (progress) {
                progress();
                pollfd ready{fd_, POLLIN, 0};
                const int polled = ::poll(&ready, 1, 1);  // progress again within a millisecond
                if (polled < 0 && errno == EINTR) continue;
                if (polled < 0) return system_error("poll");
                if (polled == 0) continue;
            }
            const ssize_t n = ::recv(fd_, bytes.data(), bytes.size(), 0);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return system_error("recv");
            if (n == 0) return Status(Errc::backend_failure, "loopback channel: the peer closed the connection");
            bytes = bytes.subspan(static_cast<std::size_t>(n));
        }
        return {};
    }

    int fd_ = -1;
    std::uint16_t port_ = 0;
};

}  // namespace loopback
