// host:port as every message, TF_CONFIG entry and connection string of the trainer writes it:
// an IPv6 host in brackets ("[::1]:2222"), a host already bracketed left as it is. Stateless.
#pragma once

#include <string>

namespace trainer::util {

inline std::string host_port(const std::string& host, long port) {
  const bool v6 = host.find(':') != std::string::npos && (host.empty() || host.front() != '[');
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace trainer::util
