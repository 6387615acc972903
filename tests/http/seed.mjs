// The seed designs' four behaviours over `outbox serve`, from Node with its built-in fetch:
// create and list topics; publish; next for a subscriber at its own position with the size
// left; unsubscribe losing the place, and deletion once every subscriber read a record.
// `node seed.mjs BASE_URL PHASE`: the test runs the phases in order, relaying and applying
// the log's retention in between; each prints one JSON line of what it saw, and fails (exit
// 1) on the first surprise.
import assert from "node:assert/strict";

const [base, phase] = process.argv.slice(2);

async function call(method, path, body) {
  const answer = await fetch(base + path, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await answer.text();
  return { status: answer.status, body: text ? JSON.parse(text) : null };
}

const phases = {
  // Create and list topics; subscribe two readers from now; publish three posts.
  async publish() {
    assert.equal((await call("POST", "/v1/topics", { name: "posts", partitions: 1 })).status, 201);
    assert.equal((await call("POST", "/v1/topics", { name: "posts", partitions: 1 })).status, 409);
    const listed = await call("GET", "/v1/topics");
    assert.deepEqual(listed.body.topics.map((t) => t.name), ["posts"]);
    for (const reader of ["alice", "bob"]) {
      assert.equal((await call("PUT", `/v1/topics/posts/subscriptions/${reader}`, {})).status, 201);
    }
    const posted = await call("POST", "/v1/topics/posts/messages", [
      { payload: { text: "one" }, key: "thread" },
      { payload: { text: "two" }, key: "thread" },
      { payload: { text: "three" }, key: "thread" },
    ]);
    assert.equal(posted.status, 201);
    return { message_ids: posted.body.message_ids };
  },
  // Each reader at its own position: alice reads one, then the rest; bob nothing yet.
  async read() {
    const first = await call("GET", "/v1/topics/posts/subscriptions/alice/next?max=1&wait_ms=5000");
    assert.equal(first.status, 200);
    assert.deepEqual(first.body.records.map((r) => r.payload.text), ["one"]);
    assert.equal((await call("POST", "/v1/topics/posts/subscriptions/alice/ack", { cursor: first.body.cursor })).status, 200);
    const left = (await call("GET", "/v1/topics/posts/subscriptions/alice")).body.lag;
    const rest = await call("GET", "/v1/topics/posts/subscriptions/alice/next?max=10");
    assert.deepEqual(rest.body.records.map((r) => r.payload.text), ["two", "three"]);
    assert.equal((await call("POST", "/v1/topics/posts/subscriptions/alice/ack", { cursor: rest.body.cursor })).status, 200);
    const none = await call("GET", "/v1/topics/posts/subscriptions/alice/next?wait_ms=200");
    assert.equal(none.status, 204);
    const topic = (await call("GET", "/v1/topics/posts")).body;
    return {
      alice_left_after_one: left,
      subscriptions: topic.subscriptions,
      message_ids: [...first.body.records, ...rest.body.records].map((r) => r.message_id),
    };
  },
  // bob reads everything at once (acknowledged as read).
  async catch_up() {
    const all = await call("GET", "/v1/topics/posts/subscriptions/bob/next?ack=auto&max=10");
    assert.deepEqual(all.body.records.map((r) => r.payload.text), ["one", "two", "three"]);
    return { bob_lag: (await call("GET", "/v1/topics/posts/subscriptions/bob")).body.lag };
  },
  // After retention: the posts every reader read are gone; alice unsubscribes and loses her
  // place: subscribing again starts at the latest, past a post made meanwhile.
  async leave() {
    const records = (await call("GET", "/v1/topics")).body.topics[0].records;
    assert.equal((await call("DELETE", "/v1/topics/posts/subscriptions/alice")).status, 204);
    assert.equal((await call("GET", "/v1/topics/posts/subscriptions/alice")).status, 404);
    assert.equal((await call("POST", "/v1/topics/posts/messages", { payload: { text: "four" } })).status, 201);
    return { records_after_retention: records };
  },
  async rejoin() {
    assert.equal((await call("PUT", "/v1/topics/posts/subscriptions/alice", {})).status, 201);
    const lag = (await call("GET", "/v1/topics/posts/subscriptions/alice")).body.lag;
    const none = await call("GET", "/v1/topics/posts/subscriptions/alice/next");
    const bob = await call("GET", "/v1/topics/posts/subscriptions/bob/next?ack=auto");
    return { alice_lag: lag, alice_next: none.status, bob_next: bob.body.records.map((r) => r.payload.text) };
  },
};

try {
  console.log(JSON.stringify(await phases[phase]()));
} catch (error) {
  console.error(String(error && error.stack ? error.stack : error));
  process.exit(1);
}
