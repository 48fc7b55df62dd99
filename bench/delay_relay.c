/* A TCP relay that delays every byte by a fixed time in each direction: the 1 ms link
 * delay of bench/ps_links.py on kernels without the netem qdisc.
 *
 *     delay_relay LISTEN_IP PORT TARGET_IP TARGET_PORT DELAY_US
 *
 * It waits until the target accepts connections, then listens (so a client that can
 * connect to the relay finds its server up), prints "ready" and relays every accepted
 * connection to a new connection to the target. Each direction is a reader thread that
 * stamps what it reads with its due time (now + DELAY_US) and a writer thread that sends
 * each piece when it is due, so a request and its answer each arrive DELAY_US late, as
 * through a link with that one-way delay, while the pieces in flight keep the stream
 * moving at the link's rate (at most QUEUE_LIMIT bytes wait in a direction). It exits
 * on SIGTERM, like any process the benchmark stops by its PID.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64 * 1024)
#define QUEUE_LIMIT (8 * 1024 * 1024)

typedef struct chunk {
    struct chunk *next;
    struct timespec due;
    size_t len;
    char data[];
} chunk;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    chunk *head, *tail;
    size_t bytes;
    int eof, dead, src, dst;
} direction;

typedef struct {
    direction ab, ba;
} connection;

static long delay_ns;

static void direction_init(direction *d, int src, int dst) {
    memset(d, 0, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->src = src;
    d->dst = dst;
}

static void *reader(void *arg) {
    direction *d = arg;
    for (;;) {
        chunk *c = malloc(sizeof(chunk) + CHUNK);
        ssize_t n = c ? read(d->src, c->data, CHUNK) : -1;
        if (n < 0 && errno == EINTR) {
            free(c);
            continue;
        }
        pthread_mutex_lock(&d->mu);
        if (n <= 0 || d->dead) {
            free(c);
            d->eof = 1;
            pthread_cond_broadcast(&d->cv);
            pthread_mutex_unlock(&d->mu);
            return NULL;
        }
        c->len = (size_t)n;
        c->next = NULL;
        clock_gettime(CLOCK_MONOTONIC, &c->due);
        c->due.tv_nsec += delay_ns;
        c->due.tv_sec += c->due.tv_nsec / 1000000000L;
        c->due.tv_nsec %= 1000000000L;
        while (d->bytes > QUEUE_LIMIT && !d->dead)
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->tail)
            d->tail->next = c;
        else
            d->head = c;
        d->tail = c;
        d->bytes += c->len;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
}

static int write_all(int fd, const char *p, size_t len) {
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void *writer(void *arg) {
    direction *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->head && !d->eof)
            pthread_cond_wait(&d->cv, &d->mu);
        chunk *c = d->head;
        if (c) {
            d->head = c->next;
            if (!d->head)
                d->tail = NULL;
            d->bytes -= c->len;
            pthread_cond_broadcast(&d->cv);
        }
        pthread_mutex_unlock(&d->mu);
        if (!c)
            break; /* the source ended and everything it sent went out */
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &c->due, NULL) == EINTR) {
        }
        int failed = write_all(d->dst, c->data, c->len);
        free(c);
        if (failed) {
            pthread_mutex_lock(&d->mu);
            d->dead = 1;
            pthread_cond_broadcast(&d->cv);
            pthread_mutex_unlock(&d->mu);
            shutdown(d->src, SHUT_RD); /* wakes the reader blocked on its source */
            break;
        }
    }
    shutdown(d->dst, SHUT_WR);
    return NULL;
}

static void *serve(void *arg) {
    connection *conn = arg;
    pthread_t t[4];
    pthread_create(&t[0], NULL, reader, &conn->ab);
    pthread_create(&t[1], NULL, writer, &conn->ab);
    pthread_create(&t[2], NULL, reader, &conn->ba);
    pthread_create(&t[3], NULL, writer, &conn->ba);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (direction *d = &conn->ab; d <= &conn->ba; d++)
        while (d->head) {
            chunk *c = d->head;
            d->head = c->next;
            free(c);
        }
    close(conn->ab.src);
    close(conn->ab.dst);
    free(conn);
    return NULL;
}

static struct sockaddr_in address(const char *ip, const char *port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(port));
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "delay_relay: %s is not an IPv4 address\n", ip);
        exit(2);
    }
    return a;
}

static int dial(const struct sockaddr_in *target) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (const struct sockaddr *)target, sizeof *target) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: delay_relay LISTEN_IP PORT TARGET_IP TARGET_PORT DELAY_US\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in listen_at = address(argv[1], argv[2]);
    struct sockaddr_in target = address(argv[3], argv[4]);
    delay_ns = atol(argv[5]) * 1000L;
    int probe;
    while ((probe = dial(&target)) < 0)
        usleep(100000); /* the benchmark stops us if the target never comes up */
    close(probe);
    int server = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(server, (struct sockaddr *)&listen_at, sizeof listen_at) < 0 ||
        listen(server, 64) < 0) {
        perror("delay_relay: listen");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int client = accept(server, NULL, NULL);
        if (client < 0) {
            if (errno == EINTR)
                continue;
            perror("delay_relay: accept");
            return 1;
        }
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int upstream = dial(&target);
        if (upstream < 0) {
            close(client);
            continue;
        }
        connection *conn = malloc(sizeof *conn);
        direction_init(&conn->ab, client, upstream);
        direction_init(&conn->ba, upstream, client);
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_create(&t, &attr, serve, conn);
        pthread_attr_destroy(&attr);
    }
}
