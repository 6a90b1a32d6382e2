import XCTest

@testable import HTTPServer

/// Every transition of a connection's lifecycle, without sockets or clocks.
final class ConnectionStateMachineTests: XCTestCase {
    typealias Machine = ConnectionStateMachine
    let timeouts = Machine.Timeouts(header: 10, body: 30, keepAlive: 60, write: 20, linger: 2)

    func machine(now: UInt64 = 1000) -> Machine { Machine(timeouts: timeouts, now: now) }

    /// A connection whose handler is running a request without a body (admitted at 1000).
    func handling() -> Machine {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        _ = connection.headAdmitted(hasBody: false, expectsContinue: false, now: 1000)
        XCTAssertEqual(connection.requestComplete(), .dispatch)
        return connection
    }

    func testNewConnectionMustSendAHeadWithinTheHeaderTimeoutOrIsClosedQuietly() {
        var connection = machine()
        XCTAssertEqual(connection.state, .idle)
        XCTAssertEqual(connection.deadline, 1010)
        XCTAssertEqual(connection.deadlineKind, .close)
        XCTAssertEqual(connection.deadlinePassed(), .close)
        XCTAssertEqual(connection.state, .closed)
    }

    func testARequestWithoutBodyGoesFromHeadToHandlerToNextRequest() {
        var connection = machine()
        connection.bytesArrived(now: 1001)
        XCTAssertEqual(connection.state, .readingHead)
        XCTAssertEqual(connection.deadline, 1011)
        XCTAssertEqual(connection.deadlineKind, .requestTimeout)
        XCTAssertEqual(connection.headAdmitted(hasBody: false, expectsContinue: false, now: 1002), .none)
        XCTAssertEqual(connection.state, .readingBody)
        XCTAssertEqual(connection.requestComplete(), .dispatch)
        XCTAssertEqual(connection.state, .handling)
        XCTAssertEqual(connection.deadlineKind, .none, "a running handler bounds itself")
        XCTAssertEqual(connection.responseQueued(keepAlive: true), .nextRequest)
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1005), .none)
        XCTAssertEqual(connection.state, .idle)
        XCTAssertEqual(connection.deadline, 1065, "keep-alive timeout")
        XCTAssertEqual(connection.deadlineKind, .close)
    }

    func testPipelinedRequestAlreadyBufferedIsUnderTheHeaderDeadline() {
        var connection = handling()
        connection.responseQueued(keepAlive: true)
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: true, now: 1003), .none)
        XCTAssertEqual(connection.state, .readingHead)
        XCTAssertEqual(connection.deadline, 1013)
        XCTAssertEqual(connection.deadlineKind, .requestTimeout)
    }

    func testBytesWhileHandlingChangeNothingSoResponsesStayInOrder() {
        var connection = handling()
        connection.bytesArrived(now: 1001)
        XCTAssertEqual(connection.state, .handling)
        XCTAssertEqual(connection.deadlineKind, .none)
    }

    func testBodyDeadlineCoversTheWholeBodyAndExpiresWith408() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.headAdmitted(hasBody: true, expectsContinue: false, now: 1001), .none)
        XCTAssertEqual(connection.deadline, 1031)
        XCTAssertEqual(connection.deadlineKind, .requestTimeout)
        // A byte now and then does not buy more time: the deadline is for the whole body.
        for now in stride(from: UInt64(1002), through: 1030, by: 4) {
            connection.bytesArrived(now: now)
            XCTAssertEqual(connection.deadline, 1031, "moved by bytes at \(now)")
            XCTAssertEqual(connection.deadlineKind, .requestTimeout)
        }
        XCTAssertEqual(connection.state, .readingBody)
        XCTAssertEqual(connection.deadlinePassed(), .sendRequestTimeout)
        XCTAssertEqual(connection.state, .writing(after: .close))
        XCTAssertEqual(connection.deadlineKind, .close, "then the client gets the write timeout to read the 408")
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1051), .close)
    }

    func testHeadTimeoutIs408() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.deadlinePassed(), .sendRequestTimeout)
    }

    func testHeadDeadlineCoversTheWholeHead() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        for now in stride(from: UInt64(1001), through: 1009, by: 2) {
            connection.bytesArrived(now: now)
            XCTAssertEqual(connection.deadline, 1010, "moved by bytes at \(now)")
        }
    }

    func testBodyAfter100ContinueHasOneDeadlineFromAdmission() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.headAdmitted(hasBody: true, expectsContinue: true, now: 1000), .sendContinue)
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .none)
        connection.bytesArrived(now: 1020)
        connection.bytesArrived(now: 1029)
        XCTAssertEqual(connection.deadline, 1030)
        XCTAssertEqual(connection.deadlinePassed(), .sendRequestTimeout)
    }

    func testEachRequestOnAKeptAliveConnectionGetsAFreshBodyDeadline() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        _ = connection.headAdmitted(hasBody: true, expectsContinue: false, now: 1000)
        XCTAssertEqual(connection.requestComplete(), .dispatch)
        connection.responseQueued(keepAlive: true)
        _ = connection.outputDrained(hasBufferedInput: false, now: 1025)
        connection.bytesArrived(now: 1040)
        XCTAssertEqual(connection.deadline, 1050, "the next head's deadline")
        _ = connection.headAdmitted(hasBody: true, expectsContinue: false, now: 1041)
        XCTAssertEqual(connection.deadline, 1071, "the next body's deadline, from its own head")
    }

    func testExpectContinueIsSentAndTheBodyStaysUnderItsDeadline() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.headAdmitted(hasBody: true, expectsContinue: true, now: 1000), .sendContinue)
        // The interim response drains: the request is not over.
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .none)
        XCTAssertEqual(connection.state, .readingBody)
        XCTAssertEqual(connection.deadlineKind, .requestTimeout)
        XCTAssertEqual(connection.deadline, 1030)
        XCTAssertEqual(connection.requestComplete(), .dispatch)
    }

    func testNoContinueWithoutABody() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.headAdmitted(hasBody: false, expectsContinue: true, now: 1000), .none)
    }

    func testAnswerFromTheHeadWithABodyDueLingersThenCloses() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.answeredFromHead(hasBody: true, keepAlive: true), .linger)
        XCTAssertEqual(connection.state, .writing(after: .linger))
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .shutdownWrite)
        XCTAssertEqual(connection.state, .lingering)
        XCTAssertEqual(connection.deadline, 1003)
        XCTAssertEqual(connection.peerClosedInput(), .close, "the client closed: done")
        var expired = machine()
        expired.bytesArrived(now: 1000)
        _ = expired.answeredFromHead(hasBody: true, keepAlive: true)
        _ = expired.outputDrained(hasBufferedInput: false, now: 1001)
        XCTAssertEqual(expired.deadlinePassed(), .close, "or the linger time ran out")
    }

    func testLingeringLastsWhileTheClientSendsButNeverPastTheBodyTimeout() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        _ = connection.answeredFromHead(hasBody: true, keepAlive: true)
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .shutdownWrite)
        XCTAssertEqual(connection.deadline, 1003)
        connection.lingeringInputArrived(now: 1002)
        XCTAssertEqual(connection.deadline, 1004, "the client is still sending its body: it gets the linger time again")
        connection.lingeringInputArrived(now: 1025)
        XCTAssertEqual(connection.deadline, 1027)
        connection.lingeringInputArrived(now: 1030)
        XCTAssertEqual(connection.deadline, 1031, "at most the body timeout (30) after lingering began (1001)")
        connection.lingeringInputArrived(now: 1031)
        XCTAssertEqual(connection.deadline, 1031)
        XCTAssertEqual(connection.deadlinePassed(), .close)

        var reading = machine()
        reading.bytesArrived(now: 1000)
        _ = reading.headAdmitted(hasBody: true, expectsContinue: false, now: 1000)
        reading.lingeringInputArrived(now: 1005)
        XCTAssertEqual(reading.deadline, 1030, "only a lingering connection: a body's deadline is whole")
    }

    func testAnswerFromTheHeadWithoutBodyKeepsTheConnectionAndDropsTheParsedRequest() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.answeredFromHead(hasBody: false, keepAlive: true), .nextRequest)
        XCTAssertEqual(connection.requestComplete(), .ignoreRequest, "the parser's empty request was answered already")
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .none)
        XCTAssertEqual(connection.state, .idle)
        // The next request is dispatched as usual.
        connection.bytesArrived(now: 1002)
        _ = connection.headAdmitted(hasBody: false, expectsContinue: false, now: 1002)
        XCTAssertEqual(connection.requestComplete(), .dispatch)
    }

    func testAnswerFromTheHeadOfAConnectionCloseRequestCloses() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        XCTAssertEqual(connection.answeredFromHead(hasBody: false, keepAlive: false), .close)
        _ = connection.requestComplete()
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .close)
    }

    func testResponseWithoutKeepAliveClosesAfterWriting() {
        var connection = handling()
        XCTAssertEqual(connection.responseQueued(keepAlive: false), .close)
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: true, now: 1001), .close)
        XCTAssertEqual(connection.state, .closed)
    }

    func testProtocolErrorClosesAfterTheErrorIsWritten() {
        var connection = machine()
        connection.bytesArrived(now: 1000)
        connection.protocolErrorQueued()
        XCTAssertEqual(connection.state, .writing(after: .close))
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .close)
    }

    func testSlowReaderGetsTheWriteTimeoutExtendedWhileItReads() {
        var connection = handling()
        connection.responseQueued(keepAlive: true)
        connection.writeBlocked(now: 1001)
        XCTAssertEqual(connection.deadline, 1021)
        XCTAssertEqual(connection.deadlineKind, .close)
        connection.wroteSome(now: 1015)
        XCTAssertEqual(connection.deadline, 1035)
        XCTAssertEqual(connection.deadlinePassed(), .close)
    }

    func testPeerClosingItsSideClosesUnlessAResponseIsOwed() {
        for state in ["idle", "readingHead", "readingBody"] {
            var connection = machine()
            if state != "idle" { connection.bytesArrived(now: 1000) }
            if state == "readingBody" { _ = connection.headAdmitted(hasBody: true, expectsContinue: false, now: 1000) }
            XCTAssertEqual(connection.peerClosedInput(), .close, state)
        }
        var answering = handling()
        XCTAssertEqual(answering.peerClosedInput(), .none, "a half-closed client still gets its answer")
        XCTAssertEqual(answering.state, .handling)
    }

    func testShutdownClosesIdleConnectionsAndEndsKeepAliveOfTheOthers() {
        var idle = machine()
        XCTAssertEqual(idle.shutdownBegan(), .close)

        var inFlight = handling()
        XCTAssertEqual(inFlight.shutdownBegan(), .none, "in-flight requests finish")
        XCTAssertEqual(inFlight.responseQueued(keepAlive: true), .close, "but their connection closes after")

        var writing = handling()
        writing.responseQueued(keepAlive: true)
        XCTAssertEqual(writing.shutdownBegan(), .none)
        XCTAssertEqual(writing.outputDrained(hasBufferedInput: false, now: 1001), .close)
    }

    func testRequestCompletingOutsideReadingBodyIsIgnored() {
        var connection = machine()
        XCTAssertEqual(connection.requestComplete(), .ignoreRequest)
        XCTAssertEqual(connection.state, .idle)
    }

    // MARK: - Streamed responses

    func testStreamedResponseHasNoDeadlineWhileTheProducerSetsThePaceThenGoesOnToTheNextRequest() {
        var connection = handling()
        XCTAssertEqual(connection.streamStarted(keepAlive: true), .nextRequest)
        XCTAssertEqual(connection.state, .streaming(after: .nextRequest))
        XCTAssertTrue(connection.isStreaming)
        XCTAssertEqual(connection.deadlineKind, .none, "an idle stream waits for its producer, not the client")
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .none)
        XCTAssertEqual(connection.state, .streaming(after: .nextRequest), "drained output does not end the body")
        connection.bytesArrived(now: 1002)
        XCTAssertEqual(
            connection.state, .streaming(after: .nextRequest), "a pipelined request waits for the body's end")
        connection.streamEnded()
        XCTAssertEqual(connection.state, .writing(after: .nextRequest))
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1003), .none)
        XCTAssertEqual(connection.state, .idle)
        XCTAssertEqual(connection.deadline, 1063)
    }

    func testStreamedResponseToAClientThatStopsReadingIsClosedAfterTheWriteTimeout() {
        var connection = handling()
        connection.streamStarted(keepAlive: true)
        connection.writeBlocked(now: 1010)
        XCTAssertEqual(connection.deadline, 1030)
        XCTAssertEqual(connection.deadlineKind, .close)
        connection.wroteSome(now: 1015)
        XCTAssertEqual(connection.deadline, 1035, "a client that reads keeps its time")
        connection.writeBlocked(now: 1016)
        XCTAssertEqual(connection.deadline, 1035, "blocking again does not move it")
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1020), .none)
        XCTAssertEqual(connection.deadlineKind, .none, "caught up: no deadline until the next blocked write")
        connection.writeBlocked(now: 1040)
        XCTAssertEqual(connection.deadlinePassed(), .close)
        XCTAssertEqual(connection.state, .closed)
    }

    func testStreamedResponseEndsWithTheWriteDeadlineStillRunningWhenTheClientIsBehind() {
        var connection = handling()
        connection.streamStarted(keepAlive: false)
        connection.writeBlocked(now: 1010)
        connection.streamEnded()
        XCTAssertEqual(connection.state, .writing(after: .close))
        XCTAssertEqual(connection.deadline, 1030)
        XCTAssertEqual(connection.deadlineKind, .close)
    }

    func testCloseDelimitedOrRefusedKeepAliveStreamClosesAfterItsBody() {
        var connection = handling()
        XCTAssertEqual(connection.streamStarted(keepAlive: false), .close)
        connection.streamEnded()
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: true, now: 1001), .close)
        XCTAssertEqual(connection.state, .closed)
    }

    func testAbandonedStreamClosesOnceWhatWasWrittenIsSent() {
        var connection = handling()
        connection.streamStarted(keepAlive: true)
        connection.streamAbandoned()
        XCTAssertEqual(connection.state, .writing(after: .close), "never the next request: the body is cut off")
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .close)
        var answered = handling()
        answered.streamAbandoned()
        XCTAssertEqual(answered.state, .handling, "only a stream can be abandoned")
    }

    func testClientClosingItsSideEndsAStream() {
        var connection = handling()
        connection.streamStarted(keepAlive: true)
        XCTAssertEqual(connection.peerClosedInput(), .close)
        XCTAssertEqual(connection.state, .closed)
    }

    func testShutdownTellsAStreamsProducerAndClosesAfterTheBody() {
        var connection = handling()
        connection.streamStarted(keepAlive: true)
        XCTAssertEqual(connection.shutdownBegan(), .endStream)
        XCTAssertEqual(connection.state, .streaming(after: .close))
        connection.streamEnded()
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1001), .close)

        var late = handling()
        XCTAssertEqual(late.shutdownBegan(), .none)
        XCTAssertEqual(late.streamStarted(keepAlive: true), .close, "a stream started during shutdown closes after")
    }

    func testStreamStartsOnlyFromAHandler() {
        var connection = machine()
        XCTAssertEqual(connection.streamStarted(keepAlive: true), .close)
        XCTAssertEqual(connection.state, .idle)
    }

    // MARK: - WebSocket

    func testWebSocketIsIdleTimedAndEveryFrameRestartsIt() {
        var connection = handling()
        connection.webSocketStarted(idleTimeout: 90, now: 1005)
        XCTAssertEqual(connection.state, .webSocket)
        XCTAssertTrue(connection.isWebSocket)
        XCTAssertEqual(connection.deadline, 1095)
        XCTAssertEqual(connection.deadlineKind, .close)
        connection.webSocketActivity(now: 1050)
        XCTAssertEqual(connection.deadline, 1140, "a heartbeat keeps the socket")
        XCTAssertEqual(connection.deadlinePassed(), .close)
        XCTAssertEqual(connection.state, .closed)
    }

    func testWebSocketWhoseClientStopsReadingGetsTheWriteTimeoutWhateverItSends() {
        var connection = handling()
        connection.webSocketStarted(idleTimeout: 90, now: 1000)
        connection.writeBlocked(now: 1010)
        XCTAssertEqual(connection.deadline, 1030)
        connection.webSocketActivity(now: 1020)
        XCTAssertEqual(connection.deadline, 1030, "frames arriving do not excuse a client that reads nothing")
        connection.wroteSome(now: 1025)
        XCTAssertEqual(connection.deadline, 1045, "reading extends it")
        XCTAssertEqual(connection.outputDrained(hasBufferedInput: false, now: 1040), .none)
        XCTAssertEqual(connection.state, .webSocket)
        XCTAssertEqual(connection.deadline, 1130, "drained: idle-timed again")
    }

    func testWebSocketEndsWithCloseFrameThenLingersOrClosesAfterThePeersClose() {
        var ended = handling()
        ended.webSocketStarted(idleTimeout: 90, now: 1000)
        ended.webSocketEnded()
        XCTAssertEqual(ended.state, .writing(after: .linger))
        XCTAssertEqual(ended.outputDrained(hasBufferedInput: false, now: 1001), .shutdownWrite)
        XCTAssertEqual(ended.state, .lingering)
        XCTAssertEqual(ended.deadline, 1003)

        var answered = handling()
        answered.webSocketStarted(idleTimeout: 90, now: 1000)
        answered.webSocketClosedByPeer()
        XCTAssertEqual(answered.state, .writing(after: .close))
        XCTAssertEqual(answered.outputDrained(hasBufferedInput: false, now: 1001), .close)
    }

    func testWebSocketHalfOpenClosesAndShutdownAsksForCloseFrame() {
        var halfOpen = handling()
        halfOpen.webSocketStarted(idleTimeout: 90, now: 1000)
        XCTAssertEqual(halfOpen.peerClosedInput(), .close)
        XCTAssertEqual(halfOpen.state, .closed)

        var stopping = handling()
        stopping.webSocketStarted(idleTimeout: 90, now: 1000)
        XCTAssertEqual(stopping.shutdownBegan(), .endWebSocket)
        XCTAssertEqual(stopping.state, .webSocket, "the loop queues close 1001, then the socket ends")
    }
}
