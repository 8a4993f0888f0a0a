"""Issue 29, item 3: get() of one message whose payload holds 100 orders, argv[1]
times, to count under callgrind what reading a stored payload costs the client:
    valgrind --tool=callgrind python3.11 bench/get_payload.py N [URL]"""
import sys, delayq
q = delayq.DelayQueue(sys.argv[2] if len(sys.argv) > 2 else "redis://127.0.0.1:6379", "decode")
orders = [{"order_id": 10086 + i, "action": "close", "amount": 12.5, "tags": ["a", "b"]} for i in range(100)]
mid = q.push({"orders": orders}, 3600)
for _ in range(int(sys.argv[1])):
    q.get(mid)
