import XCTest

@testable import Postgres

/// The pool's decisions without sockets, threads or sleeps.
final class PoolStateMachineTests: XCTestCase {
    typealias Machine = PoolStateMachine

    func machine(max: Int = 2, waiting: Int = 3) -> Machine {
        Machine(configuration: .init(maxConnections: max, maxWaiting: waiting))
    }

    func testFirstRequestOpensAConnectionAndGetsItWhenOpen() {
        var pool = machine()
        XCTAssertEqual(pool.request(1, deadline: 100), [.open(0)])
        XCTAssertEqual(pool.waitingCount, 1)
        XCTAssertEqual(pool.connectionOpened(0), [.lease(0, to: 1)])
        XCTAssertEqual(pool.leasedCount, 1)
        XCTAssertEqual(pool.waitingCount, 0)
    }

    func testAnIdleConnectionIsReusedWithoutOpeningAnother() {
        var pool = machine()
        _ = pool.request(1, deadline: 100)
        _ = pool.connectionOpened(0)
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [])
        XCTAssertEqual(pool.request(2, deadline: 100), [.lease(0, to: 2)])
        XCTAssertEqual(pool.openCount, 1)
    }

    func testOpensUpToTheMaximumThenQueuesInOrder() {
        var pool = machine(max: 2, waiting: 10)
        XCTAssertEqual(pool.request(1, deadline: 100), [.open(0)])
        XCTAssertEqual(pool.request(2, deadline: 100), [.open(1)])
        XCTAssertEqual(pool.request(3, deadline: 100), [], "at the maximum: wait")
        XCTAssertEqual(pool.connectionOpened(1), [.lease(1, to: 1)], "oldest first, whichever connection opens")
        XCTAssertEqual(pool.connectionOpened(0), [.lease(0, to: 2)])
        XCTAssertEqual(pool.connectionReleased(1, reusable: true), [.lease(1, to: 3)])
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [])
        XCTAssertEqual(pool.connectionReleased(1, reusable: true), [])
        XCTAssertEqual(pool.openCount, 2)
        XCTAssertEqual(pool.leasedCount, 0)
    }

    func testALowerLimitClosesIdleConnectionsAtOnceAndLeasedOnesWhenGivenBack() {
        var pool = machine(max: 3, waiting: 10)
        for request in 1...3 { _ = pool.request(UInt64(request), deadline: 100) }
        for id in 0..<3 { _ = pool.connectionOpened(id) }
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [])
        XCTAssertEqual(pool.limit(to: 1), [.close(0)], "the idle one goes at once")
        XCTAssertEqual(pool.connectionReleased(1, reusable: true), [.close(1)], "above the limit: closed, not kept")
        XCTAssertEqual(pool.connectionReleased(2, reusable: true), [], "within it: kept")
        XCTAssertEqual(pool.request(4, deadline: 100), [.lease(2, to: 4)])
        XCTAssertEqual(pool.request(5, deadline: 100), [], "no new connection above the limit")
    }

    func testExhaustionFailsAtOnceWhenTheQueueIsFull() {
        var pool = machine(max: 1, waiting: 2)
        _ = pool.request(1, deadline: 100)
        _ = pool.connectionOpened(0)
        XCTAssertEqual(pool.request(2, deadline: 100), [])
        XCTAssertEqual(pool.request(3, deadline: 100), [])
        XCTAssertEqual(pool.request(4, deadline: 100), [.fail(4, .exhausted)])
        XCTAssertEqual(pool.waitingCount, 2)
    }

    func testWaitersPastTheirDeadlineFailAndTheRestKeepWaiting() {
        var pool = machine(max: 1, waiting: 10)
        _ = pool.request(1, deadline: 100)
        _ = pool.connectionOpened(0)
        _ = pool.request(2, deadline: 110)
        _ = pool.request(3, deadline: 120)
        XCTAssertEqual(pool.nextDeadline, 110)
        XCTAssertEqual(pool.timePassed(109), [])
        XCTAssertEqual(pool.timePassed(115), [.fail(2, .exhausted)])
        XCTAssertEqual(pool.nextDeadline, 120)
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [.lease(0, to: 3)])
        XCTAssertNil(pool.nextDeadline)
    }

    func testASlowQueryNextToFastOnesOnlyHoldsItsOwnConnection() {
        var pool = machine(max: 2, waiting: 10)
        _ = pool.request(1, deadline: 1000)  // slow
        _ = pool.request(2, deadline: 1000)
        _ = pool.connectionOpened(0)
        _ = pool.connectionOpened(1)
        // Request 1 keeps connection 0; the fast ones take turns on connection 1.
        for id in UInt64(3)...10 {
            XCTAssertEqual(pool.request(id, deadline: 1000), [])
            XCTAssertEqual(pool.connectionReleased(1, reusable: true), [.lease(1, to: id)])
        }
        XCTAssertEqual(pool.connections[0], .leased(1))
    }

    func testABrokenConnectionIsClosedAndReplacedWhileRequestsWait() {
        var pool = machine(max: 1, waiting: 10)
        _ = pool.request(1, deadline: 100)
        _ = pool.connectionOpened(0)
        _ = pool.request(2, deadline: 100)
        // Lost mid-query: given back broken.
        XCTAssertEqual(pool.connectionReleased(0, reusable: false), [.close(0), .open(1)])
        XCTAssertEqual(pool.connectionOpened(1), [.lease(1, to: 2)])
        // Broken with nobody waiting: just closed.
        XCTAssertEqual(pool.connectionReleased(1, reusable: false), [.close(1)])
        XCTAssertEqual(pool.openCount, 0)
    }

    func testAFailedOpenFailsTheRequestThatCausedItAndRetriesForTheOthers() {
        var pool = machine(max: 1, waiting: 10)
        _ = pool.request(1, deadline: 100)
        _ = pool.request(2, deadline: 100)
        XCTAssertEqual(pool.connectionFailed(0), [.fail(1, .connectionFailed), .open(1)])
        XCTAssertEqual(pool.connectionFailed(1), [.fail(2, .connectionFailed)])
        XCTAssertEqual(pool.connections.count, 0, "nothing waits: no retry loop")
        XCTAssertEqual(pool.request(3, deadline: 100), [.open(2)], "the next request tries again")
    }

    func testCancelledWaiterLeavesTheQueue() {
        var pool = machine(max: 1, waiting: 10)
        _ = pool.request(1, deadline: 100)
        _ = pool.connectionOpened(0)
        _ = pool.request(2, deadline: 100)
        _ = pool.request(3, deadline: 100)
        XCTAssertEqual(pool.cancel(2), [.fail(2, .cancelled)])
        XCTAssertEqual(pool.cancel(2), [], "once")
        XCTAssertEqual(pool.cancel(1), [], "a leased request gives its connection back instead")
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [.lease(0, to: 3)])
    }

    func testShutdownFailsWaitersClosesIdleAndLeasedOnRelease() {
        var pool = machine(max: 3, waiting: 10)
        _ = pool.request(1, deadline: 100)
        _ = pool.request(2, deadline: 100)
        _ = pool.request(3, deadline: 100)
        _ = pool.connectionOpened(0)  // → 1
        _ = pool.connectionOpened(1)  // → 2
        _ = pool.connectionOpened(2)  // → 3
        _ = pool.connectionReleased(2, reusable: true)  // idle
        _ = pool.request(4, deadline: 100)  // takes 2
        _ = pool.request(5, deadline: 100)  // waits
        XCTAssertEqual(pool.shutdown(), [.fail(5, .closed)])
        XCTAssertEqual(pool.request(6, deadline: 100), [.fail(6, .closed)])
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [.close(0)])
        XCTAssertEqual(pool.connectionReleased(1, reusable: true), [.close(1)])
        XCTAssertEqual(pool.connectionReleased(2, reusable: true), [.close(2), .shutdownComplete])
        XCTAssertEqual(pool.shutdown(), [], "once")
    }

    func testShutdownWithIdleAndOpeningConnections() {
        var pool = machine(max: 2, waiting: 10)
        _ = pool.request(1, deadline: 100)
        _ = pool.connectionOpened(0)
        _ = pool.connectionReleased(0, reusable: true)
        _ = pool.request(2, deadline: 100)  // takes 0
        _ = pool.request(3, deadline: 100)  // opens 1
        XCTAssertEqual(pool.shutdown(), [.fail(3, .closed)])
        XCTAssertEqual(pool.connectionOpened(1), [.close(1)], "opened too late: closed")
        XCTAssertEqual(pool.connectionReleased(0, reusable: true), [.close(0), .shutdownComplete])

        var empty = machine()
        XCTAssertEqual(empty.shutdown(), [.shutdownComplete])
    }

    func testEventsForUnknownConnectionsChangeNothing() {
        var pool = machine()
        XCTAssertEqual(pool.connectionOpened(7), [])
        XCTAssertEqual(pool.connectionFailed(7), [])
        XCTAssertEqual(pool.connectionReleased(7, reusable: true), [])
    }
}
