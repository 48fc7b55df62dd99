// gRPC clients in C++ timing each call: the gRPC figures of bench/serving_bench.py
// without a Python client's own time in them (as bench/latency_client.c for REST).
//
//     grpc_latency_client TARGET METHOD REQUEST_FILE WARMUP N [CLIENTS SECONDS]
//
// TARGET is HOST:PORT, METHOD the full method name (/tensorflow.serving.
// PredictionService/Predict), REQUEST_FILE the request already serialized (the client
// sends its bytes as they are: no protos compiled here). With five arguments one
// client on one channel sends WARMUP calls untimed, then N timed ones, one at a time,
// and prints the N times in seconds as one JSON list. With CLIENTS and SECONDS,
// CLIENTS threads, each on a channel of its own (its own connection), send WARMUP
// calls each, meet, then call one at a time for SECONDS; it prints
// {"times": [...], "wall": s}. A call that does not end OK is one line on stderr and
// exit status 1.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "grpc_latency_client: %s\n", what.c_str());
  std::exit(1);
}

class Caller {
 public:
  Caller(const std::string& target, int index, std::string method,
         const std::string& request)
      : method_(std::move(method)) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own
    args.SetInt("mljob.bench.client", index);
    args.SetMaxReceiveMessageSize(-1);
    stub_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    grpc::Slice slice(request);
    request_ = grpc::ByteBuffer(&slice, 1);
  }

  double Call() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::ByteBuffer answer;
    grpc::Status status;
    auto start = Clock::now();
    auto call = stub_->PrepareUnaryCall(&context, method_, request_, &queue_);
    call->StartCall();
    call->Finish(&answer, &status, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    if (!queue_.Next(&tag, &ok) || !ok) fail("the completion queue failed");
    double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (!status.ok())
      fail("status " + std::to_string(status.error_code()) + ": " +
           status.error_message());
    return took;
  }

 private:
  std::string method_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::ByteBuffer request_;
  grpc::CompletionQueue queue_;
};

void print_list(const std::vector<double>& times) {
  std::printf("[");
  for (size_t i = 0; i < times.size(); i++) std::printf(i ? ", %.9f" : "%.9f", times[i]);
  std::printf("]");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 8)
    fail("usage: grpc_latency_client TARGET METHOD REQUEST_FILE WARMUP N [CLIENTS SECONDS]");
  std::ifstream file(argv[3], std::ios::binary);
  if (!file) fail("cannot open the request file");
  std::string request((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  int warmup = std::atoi(argv[4]), n = std::atoi(argv[5]);
  if (argc == 6) {
    Caller caller(argv[1], 0, argv[2], request);
    std::vector<double> times;
    for (int i = 0; i < warmup + n; i++) {
      double took = caller.Call();
      if (i >= warmup) times.push_back(took);
    }
    print_list(times);
    std::printf("\n");
    return 0;
  }
  int clients = std::atoi(argv[6]);
  double seconds = std::atof(argv[7]);
  if (clients < 1 || seconds <= 0) fail("CLIENTS and SECONDS must be positive");
  std::vector<std::vector<double>> times(clients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point end;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; c++) {
    threads.emplace_back([&, c] {
      Caller caller(argv[1], c, argv[2], request);
      for (int i = 0; i < warmup; i++) caller.Call();
      ready++;
      while (!go.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      while (Clock::now() < end) times[c].push_back(caller.Call());
    });
  }
  while (ready.load() < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto start = Clock::now();
  end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go = true;
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (auto& each : times) all.insert(all.end(), each.begin(), each.end());
  std::printf("{\"times\": ");
  print_list(all);
  std::printf(", \"wall\": %.6f}\n", wall);
  return 0;
}
